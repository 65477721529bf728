"""Signed proof of a passing verify (envbuilder/attest/, docs/attestation.md), with the real
cosign 3.1.1 (.ci/install-cosign.sh) and, for the job gate, the real one-node Slurm:

- a statement comes from a passing, complete verify only (the report here is a real one: the
  cpu-torch SIF, 2 ranks, charliecloud, 2026-11-28); a failed or partial run writes nothing;
- `attest sign` + `attest check` round trip on a file, offline (no transparency log);
- hostile input: one byte changed in the image or the attestation, an attestation of another
  image, a failed report signed by another key, a key file that is not a key, a 1 GB
  attestation (sparse), none at all, another stack: each one message, exit 2, no traceback;
- the site keys (`attestation`, `attestation_keys`) checked like every site key;
- job.sbatch's gate under Slurm: require stops before any rank with exit 2 naming what failed,
  warn says so and goes on.

The same flow on the real cpu-torch SIF and image (Apptainer's signed group, the registry): the
SIF's tests in tests/test_sif.py, which reuse the SIF that module builds."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import RECIPES, ROOT, run_envbuilder
from infra import require_binary, require_slurm, sbatch_until_done

from envbuilder.attest.commands import attest_after_verify
from envbuilder.attest.statement import (dumps, gate_line, provenance_statement, stack_id, verify_statement,
                                         why_not_passing)
from envbuilder.attest.subject import file_subject

DATA = ROOT / "tests" / "data" / "attest"
MANIFEST = ROOT / "images" / "cpu-torch-horovod" / "manifest.json"
ENV = {"COSIGN_PASSWORD": ""}


def report() -> dict:
    return json.loads((DATA / "report-pass.json").read_text())


def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two cosign key pairs made by cosign itself: the site's and an attacker's (the tests make
    keys; envbuilder never does)."""
    require_binary("cosign", "bash .ci/install-cosign.sh (cosign 3.1.1 from Debian's unstable suite)")
    out = {}
    for who in ("site", "attacker"):
        d = tmp_path_factory.mktemp(who)
        proc = subprocess.run(["cosign", "generate-key-pair"], cwd=d, capture_output=True, text=True,
                              env={**os.environ, **ENV}, timeout=60)
        assert proc.returncode == 0, proc.stderr
        out[who] = (d / "cosign.key", d / "cosign.pub")
    return out


def write_statement(image: Path, rep: dict | None = None) -> Path:
    """The statement `verify --attest` writes for IMAGE (a file), from the real report."""
    out = Path(f"{image}.att.json")
    msg = attest_after_verify(rep or report(), str(image), MANIFEST, str(out))
    assert out.is_file(), msg
    return out


@pytest.fixture
def signed(tmp_path, keys):
    """An image file with its statement and cosign bundle beside it, signed with the site's key."""
    image = tmp_path / "x.sif"
    image.write_bytes(os.urandom(256 * 1024))
    att = write_statement(image)
    r = run_envbuilder("attest", "sign", str(att), "--key", str(keys["site"][0]), "--image", str(image), env=ENV)
    assert r.code == 0, r.err
    assert Path(f"{att}.bundle").is_file()
    return image, att


def check(image: Path, pub: Path, *extra: str):
    return run_envbuilder("attest", "check", "--image", str(image), "--key", str(pub), *extra, env=ENV)


def refused(r, words: str) -> str:
    """Exit 2, one message (error: line + fix: line), no traceback; the message names WORDS."""
    assert r.code == 2, (r.code, r.out, r.err)
    assert "Traceback" not in r.err and "Traceback" not in r.out
    lines = [l for l in r.err.splitlines() if l.strip()]
    assert lines and lines[0].startswith("error: "), r.err
    assert len(lines) <= 2 and all(l.startswith(("error: ", "  fix: ")) for l in lines), r.err
    assert words in r.err, r.err
    return r.err


# --- the statement ------------------------------------------------------------------------------

def test_a_passing_verify_gives_a_statement_with_what_passed(tmp_path):
    image = tmp_path / "x.sif"
    image.write_bytes(b"sif bytes")
    st = json.loads(write_statement(image).read_text())
    assert st["_type"] == "https://in-toto.io/Statement/v1"
    assert st["predicateType"] == "https://envbuilder.dev/attestation/verify/v1"
    assert st["subject"] == [{"name": "x.sif", "digest": {"sha256": hashlib.sha256(b"sif bytes").hexdigest()}}]
    pred = st["predicate"]
    assert pred["result"] == "passed" and pred["summary"] == {"pass": 28, "fail": 0, "skip": 10}
    names = {c["name"]: c for c in pred["checks"]}
    assert names["versions.framework"] == {"name": "versions.framework", "status": "pass", "figure": "2.13.0+cpu"}
    assert pred["stack"]["id"] == stack_id(manifest()) and pred["stack"]["spec_sha256"] == manifest()["spec_sha256"]
    assert pred["stack"]["framework"]["version"] == "2.13.0+cpu" and pred["stack"]["horovod"]["version"] == "0.28.1"
    assert pred["run"]["runtime"] == "charliecloud" and pred["run"]["ranks"] == 2 and pred["run"]["nodes"] == 1
    assert pred["envbuilder"] and pred["time"].endswith("Z")
    text = (tmp_path / "x.sif.att.json").read_text()
    assert text.splitlines().count(gate_line(st["subject"][0]["digest"]["sha256"], pred["stack"]["id"])) == 1


def _failed(r):
    r["checks"][3]["status"] = "fail"
    r["summary"] = {"pass": 27, "fail": 1, "skip": 10}
    r["ok"] = False


PARTIAL = {
    "a failed check": _failed,
    "a check still running": lambda r: r["checks"][5].update(status="running"),
    "timed out": lambda r: r["verify"].update(timed_out=True),
    "exit code 1": lambda r: r["verify"].update(exit_code=1),
    "no checks": lambda r: r.update(checks=[]),
    "all skipped": lambda r: [c.update(status="skip") for c in r["checks"]],
    "not ok": lambda r: r.update(ok=False),
    "GPU checks not run": lambda r: r.update(gpu_checks="not run: no GPU visible"),
}


@pytest.mark.parametrize("case", sorted(PARTIAL))
def test_a_failed_or_partial_verify_never_yields_a_statement(case, tmp_path):
    rep = copy.deepcopy(report())
    PARTIAL[case](rep)
    assert why_not_passing(rep)
    image = tmp_path / "x.sif"
    image.write_bytes(b"x")
    out = tmp_path / "x.sif.att.json"
    msg = attest_after_verify(rep, str(image), MANIFEST, str(out))
    assert msg.startswith("no attestation written: ") and not out.exists(), msg
    with pytest.raises(ValueError):
        verify_statement(rep, manifest(), {"name": "x", "digest": {"sha256": "0" * 64}})


def test_a_real_failed_verify_writes_no_attestation(tmp_path):
    """The suite for real (the host's smoke Python, no multi-rank run) against a manifest that
    expects another torch: verify fails (exit 1) and --attest writes nothing."""
    from infra import smoke_python

    python = smoke_python()
    if python is None:
        pytest.skip("no host smoke environment (.ci/make-smoke-venv.sh)")
    bad = manifest()
    bad["expect"]["framework"]["version"] = "9.9.9"
    (tmp_path / "manifest.json").write_text(json.dumps(bad))
    out = tmp_path / "x.att.json"
    r = run_envbuilder("verify", "--runtime", "host", "--manifest", str(tmp_path / "manifest.json"), "--python", python,
                       "--launcher", "none", "--attest", str(out), timeout=300)
    assert r.code == 1, r.out[-2000:] + r.err[-2000:]
    assert "no attestation written: " in r.err and "versions.framework" in r.err, r.err
    assert not out.exists()


def test_sign_refuses_a_statement_of_another_image(signed, keys, tmp_path):
    _, att = signed
    other = tmp_path / "other.sif"
    other.write_bytes(b"other")
    refused(run_envbuilder("attest", "sign", str(att), "--key", str(keys["site"][0]), "--image", str(other), env=ENV),
            "digest differs")


def test_sign_refuses_a_public_key_as_the_signing_key(signed, keys):
    image, att = signed
    refused(run_envbuilder("attest", "sign", str(att), "--key", str(keys["site"][1]), "--image", str(image), env=ENV),
            "is a public key, not a private key")


# --- check: the round trip and the hostile cases ----------------------------------------------------

def test_a_build_provenance_is_signed_beside_the_image_and_cosign_checks_it(tmp_path, keys):
    """The build's provenance (inputs, engine, image) signed with the user's key: a cosign bundle
    that `cosign verify-blob` itself accepts, and refuses once one byte of the provenance changed;
    never put into the SIF's signed group (the job gate reads the verify attestation there)."""
    image = tmp_path / "x.sif"
    image.write_bytes(os.urandom(64 * 1024))
    prov = tmp_path / "provenance.intoto.json"
    files = {"Dockerfile": hashlib.sha256(b"FROM scratch").hexdigest()}
    prov.write_text(dumps(provenance_statement(manifest(), files, {"engine": "docker"}, file_subject(image))))
    key, pub = keys["site"]
    refused(run_envbuilder("attest", "sign", str(prov), "--key", str(key), "--image", str(image),
                           "--format", "apptainer", env=ENV), "signed beside the SIF")
    r = run_envbuilder("attest", "sign", str(prov), "--key", str(key), "--image", str(image), env=ENV)
    assert r.code == 0 and "cosign verify-blob" in r.out, (r.out, r.err)
    bundle = Path(f"{prov}.bundle")

    def cosign_verify() -> subprocess.CompletedProcess:
        return subprocess.run(["cosign", "verify-blob", "--key", str(pub), "--bundle", str(bundle),
                               "--insecure-ignore-tlog=true", str(prov)], capture_output=True, text=True,
                              env={**os.environ, **ENV}, timeout=120)

    ok = cosign_verify()
    assert ok.returncode == 0, ok.stderr
    prov.write_text(prov.read_text().replace('"docker"', '"dockeR"'))
    assert cosign_verify().returncode != 0


def test_signed_attestation_checks_offline(signed, keys):
    image, _ = signed
    t0 = time.time()
    r = check(image, keys["site"][1], "--folder", str(MANIFEST.parent))
    assert r.code == 0, r.err
    assert "attestation ok:" in r.out and "28 passed" in r.out and "[cosign bundle]" in r.out
    print(f"attest check (256 KiB file): {time.time() - t0:.2f} s")


def test_check_with_a_second_trusted_key_finds_the_signer(signed, keys):
    image, _ = signed
    r = run_envbuilder("attest", "check", "--image", str(image), "--key", str(keys["attacker"][1]),
                       "--key", str(keys["site"][1]), "--json", env=ENV)
    assert r.code == 0 and json.loads(r.out)["key"] == str(keys["site"][1]), r.err


def _sparse_1gb(path: Path) -> None:
    path.unlink(missing_ok=True)
    with open(path, "wb") as fh:          # sparse: 1 GB on paper, no blocks on disk
        fh.truncate(1 << 30)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x01]))


def test_hostile_one_byte_changed_in_the_image(signed, keys):
    image, _ = signed
    _flip(image, 1000)
    print(refused(check(image, keys["site"][1]), "attestation: digest differs: the image is sha256:"))


def test_hostile_one_byte_changed_in_the_attestation(signed, keys):
    image, att = signed
    text = att.read_text()
    att.write_text(text.replace('"pass": 28', '"pass": 29', 1))
    print(refused(check(image, keys["site"][1]), "attestation: wrong key: the signature on"))


def test_hostile_an_attestation_of_another_image(signed, keys, tmp_path):
    image, att = signed
    other = tmp_path / "other.sif"
    other.write_bytes(os.urandom(1024))
    for suffix in (".att.json", ".att.json.bundle"):
        Path(f"{other}{suffix}").write_bytes(Path(f"{image}{suffix}").read_bytes())
    print(refused(check(other, keys["site"][1]), "attestation: digest differs"))


def test_hostile_a_failed_report_signed_by_another_key(signed, keys):
    """The attacker edits a statement to claim a pass for a failed run (or signs a failed one) with
    their own key: the site's key refuses it."""
    image, att = signed
    st = json.loads(att.read_text())
    st["predicate"]["checks"][3]["status"] = "fail"
    att.write_text(dumps(st))
    proc = subprocess.run(["cosign", "sign-blob", "--key", str(keys["attacker"][0]), "--use-signing-config=false",
                           "--tlog-upload=false", "--yes", "--bundle", f"{att}.bundle", str(att)],
                          capture_output=True, text=True, env={**os.environ, **ENV}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    print(refused(check(image, keys["site"][1]), "attestation: wrong key"))
    # with the attacker's key trusted, the failed check is still refused
    refused(check(image, keys["attacker"][1]), "attestation: verify failed")


@pytest.mark.parametrize("content", [b"not a key\n", b"-----BEGIN PUBLIC KEY-----\n!!!!\n-----END PUBLIC KEY-----\n",
                                     b"\x00\x01binary"])
def test_hostile_a_key_file_that_is_not_a_key(signed, tmp_path, content):
    image, _ = signed
    bad = tmp_path / "bad.pub"
    bad.write_bytes(content)
    print(refused(check(image, bad), "is not a key"))


def test_hostile_a_private_key_given_as_trusted_key(signed, keys):
    image, _ = signed
    refused(check(image, keys["site"][0]), "is a private key, not a public key")


def test_hostile_a_1_gb_attestation_is_refused_by_its_size(signed, keys):
    image, att = signed
    _sparse_1gb(att)
    t0 = time.time()
    err = refused(check(image, keys["site"][1]), "more than 1048576 bytes")
    assert time.time() - t0 < 10
    print(err)


def test_no_attestation_is_named(keys, tmp_path):
    image = tmp_path / "x.sif"
    image.write_bytes(b"x")
    refused(check(image, keys["site"][1], "--format", "cosign"), "attestation: no attestation:")


def test_other_stack_is_named(signed, keys):
    image, _ = signed
    refused(check(image, keys["site"][1], "--stack", "lock:" + "0" * 64), "attestation: other stack:")


# --- the site keys --------------------------------------------------------------------------------

def _site(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "site.yaml"
    p.write_text("name: gated\nruntime: charliecloud\n" + text)
    return p


@pytest.mark.parametrize("text, words", [
    ("attestation: require\n", "cluster.attestation_keys"),
    ("attestation: always\nattestation_keys: [/k.pub]\n", "attestation"),
    ("attestation: warn\nattestation_keys: [keys/site.pub]\n", "attestation_keys"),
    ("attestation: warn\nattestation_keys: ['/k.pub; rm -rf /']\n", "attestation_keys"),
])
def test_site_attestation_keys_are_checked(tmp_path, text, words):
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(tmp_path / "out"),
                       "--site", str(_site(tmp_path, text)))
    assert r.code == 2 and words in r.err and "Traceback" not in r.err, r.err
    assert not (tmp_path / "out").exists()


def test_off_writes_no_gate(tmp_path):
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(tmp_path / "out"),
                       "--site", str(_site(tmp_path, "attestation: \"off\"\nattestation_keys: [/k.pub]\n")))
    assert r.code == 0, r.err
    assert "attest_gate" not in (tmp_path / "out" / "job.sbatch").read_text()


# --- the gate in job.sbatch, under Slurm --------------------------------------------------------

def gated_folder(tmp_path: Path, policy: str, pub: Path) -> Path:
    out = tmp_path / f"job-{policy}"
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(out), "--site",
                       str(_site(tmp_path, f"attestation: {policy}\nattestation_keys: [{pub}]\n")))
    assert r.code == 0, r.err
    text = (out / "job.sbatch").read_text()
    assert text.index("attest_gate || true") < text.index("srun ")
    return out


def test_gated_job_script_passes_shellcheck(tmp_path, keys):
    folder = gated_folder(tmp_path, "require", keys["site"][1])
    proc = subprocess.run([require_binary("shellcheck"), "-s", "bash", str(folder / "job.sbatch")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def run_job(folder: Path, image: Path) -> tuple[int, str]:
    require_slurm()
    code, job_id, err = sbatch_until_done(["--output", str(folder / "slurm-%j.out"), str(folder / "job.sbatch")],
                                          cwd=folder, env={"ENVBUILDER_IMAGE": str(image)}, timeout=240)
    log = folder / f"slurm-{job_id}.out"
    return code, log.read_text() if log.is_file() else err


GATE_CASES = {
    "image changed": (lambda image, att, keys: _flip(image, 4096), "attestation: digest differs: "),
    "attestation changed": (lambda image, att, keys: att.write_text(att.read_text().replace('"pass": 28', '"pass": 30')),
                            "attestation: wrong key: "),
    "no attestation": (lambda image, att, keys: att.unlink(), "attestation: no attestation: "),
    "1 GB attestation": (lambda image, att, keys: _sparse_1gb(att), "more than 1048576 (1 MiB)"),
}


@pytest.mark.parametrize("case", sorted(GATE_CASES))
def test_job_gate_require_stops_before_any_rank(case, signed, keys, tmp_path):
    image, att = signed
    folder = gated_folder(tmp_path, "require", keys["site"][1])
    change, words = GATE_CASES[case]
    change(image, att, keys)
    code, log = run_job(folder, image)
    assert code == 2, log
    assert words in log and "cluster.attestation: require; nothing was run" in log, log
    # nothing after the gate ran: no node step, no rank, no image mount
    assert "node_setup" not in log and "mounted the SquashFS" not in log and "[smoke]" not in log, log
    print(log.strip().splitlines()[-1])


def test_job_gate_warn_says_so_and_goes_on(signed, keys, tmp_path):
    image, att = signed
    folder = gated_folder(tmp_path, "warn", keys["site"][1])
    att.unlink()
    code, log = run_job(folder, image)
    assert "warning: attestation: no attestation: " in log and "running anyway (cluster.attestation: warn)" in log, log
    # the job went on to the image check (a random file is no SIF: charliecloud's check stops it there)
    assert "cluster.attestation: require" not in log


def test_job_gate_passes_a_signed_attestation(signed, keys, tmp_path):
    image, _ = signed
    folder = gated_folder(tmp_path, "require", keys["site"][1])
    code, log = run_job(folder, image)
    assert "envbuilder: attestation ok: " in log, log
    assert "signed by " + str(keys["site"][1]) in log


# --- a SIF Apptainer pulled from the registry ---------------------------------------------------

def test_a_sif_apptainer_pulled_by_the_attested_digest_passes_and_by_tag_or_another_digest_not(keys, tmp_path):
    """The consumer's side of a registry attestation, with the real Apptainer: an image pushed to
    the loopback registry and attested there by digest; `apptainer pull docker://REPO@sha256:D`
    (tools/apptainer-node --host-network) makes the .sif, and `attest check --pulled SIF` accepts
    it; a .sif from another digest, or one that names only a tag, is refused naming why (Apptainer
    records what it pulled as the From: of the definition it writes into the SIF)."""
    import re

    from infra import (APPTAINER_NODE, BASE_IMAGE, PLAIN_BASE_IMAGE, docker_cli, require_apptainer_node,
                       require_registry)

    registry = require_registry()
    require_apptainer_node()
    docker = docker_cli()
    repo = f"{registry}/envbuilder-tests/pulled-sif"
    refs = {}
    try:
        for name, source in (("attested", BASE_IMAGE), ("other", PLAIN_BASE_IMAGE)):
            tag = f"{repo}:{name}-{os.getpid()}"
            subprocess.run([docker, "tag", source, tag], check=True, capture_output=True)
            push = subprocess.run([docker, "push", tag], capture_output=True, text=True, timeout=600)
            assert push.returncode == 0, push.stderr
            refs[name] = (tag, f"{repo}@" + re.search(r"digest: (sha256:[0-9a-f]{64})", push.stdout).group(1))
        tag, ref = refs["attested"]
        att = tmp_path / "image.att.json"
        attest_after_verify(report(), tag, MANIFEST, str(att))
        r = run_envbuilder("attest", "sign", str(att), "--key", str(keys["site"][0]), "--image", ref, env=ENV)
        assert r.code == 0, r.err
        work = tmp_path / "sifs"
        work.mkdir()
        os.chmod(work, 0o777)                       # Apptainer runs as the node's user builder
        t0 = time.time()
        pulls = " && ".join(f"apptainer pull -F {name}.sif docker://{source}" for name, source in
                            (("by-digest", ref), ("by-tag", tag), ("other", refs["other"][1])))
        proc = subprocess.run([str(APPTAINER_NODE), "--host-network", "-v", str(work), "--", "bash", "-c",
                               f"cd {work} && export APPTAINER_NOHTTPS=1 && {pulls}"], capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        print(f"apptainer pull x3 from the loopback registry: {time.time() - t0:.1f} s")

        def check_pulled(sif: str):
            return run_envbuilder("attest", "check", "--image", ref, "--key", str(keys["site"][1]),
                                  "--pulled", str(work / sif))

        for sif in ("by-digest.sif", "by-tag.sif"):
            # Apptainer 1.4.5 records the digest a tag resolved to at pull time, so a pull by tag
            # that got the attested bytes passes too (seen 2026-11-28)
            r = check_pulled(sif)
            assert r.code == 0 and "[cosign registry attestation]" in r.out, (sif, r.out + r.err)
        # a SIF whose definition names only a tag (what a pull records when it kept no digest):
        # the same SIF objects made with siftool
        tagged = tmp_path / "tag-only.sif"
        deffile = tmp_path / "definition"
        deffile.write_text(f"bootstrap: docker\nfrom: {tag}\n")
        require_binary("siftool", "apt-get install siftool")
        for argv in (["siftool", "new", str(tagged)],
                     ["siftool", "add", "--datatype", "1", "--groupid", "1", str(tagged), str(deffile)]):
            subprocess.run(argv, check=True, capture_output=True)
        refused(check_pulled(str(tagged)), "was pulled by tag")
        err = refused(check_pulled("other.sif"), "digest differs")
        assert refs["other"][1] in err, err
        nosif = tmp_path / "not.sif"
        nosif.write_bytes(b"#!/bin/sh\n" + os.urandom(512))
        refused(check_pulled(str(nosif)), "is not a readable SIF")
    finally:
        for tag, _ref in refs.values():
            subprocess.run([docker, "rmi", tag], capture_output=True)


# --- the registry form: a digest tied to the statement's image ------------------------------------

@pytest.fixture(scope="module")
def pushed(keys):
    """Two small images pushed to the loopback registry by digest: {name: (tag, REPO@sha256:D, image ID)};
    the local tag is removed again, so the digest is tied through the registry's manifest."""
    import re

    from infra import BASE_IMAGE, PLAIN_BASE_IMAGE, docker_cli, require_registry

    registry = require_registry()
    docker = docker_cli()
    repo = f"{registry}/envbuilder-tests/attest-tie-{os.getpid()}"
    out = {}
    for name, source in (("slim", BASE_IMAGE), ("plain", PLAIN_BASE_IMAGE)):
        tag = f"{repo}:{name}"
        subprocess.run([docker, "tag", source, tag], check=True, capture_output=True)
        push = subprocess.run([docker, "push", tag], capture_output=True, text=True, timeout=600)
        assert push.returncode == 0, push.stderr
        ident = subprocess.run([docker, "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True,
                               text=True, check=True).stdout.strip().removeprefix("sha256:")
        out[name] = (tag, f"{repo}@" + re.search(r"digest: (sha256:[0-9a-f]{64})", push.stdout).group(1), ident)
    yield out
    for tag, _, _ in out.values():
        subprocess.run([docker, "rmi", tag], capture_output=True)


def test_registry_sign_refuses_a_digest_of_another_image_and_one_it_cannot_tie(pushed, keys, tmp_path):
    """`attest sign --image REPO@sha256:D`: D's image (the engine's, or the registry manifest's
    config digest) must be the statement's subject; a digest neither knows is refused, never
    signed on trust."""
    from infra import docker_cli

    tag, _, _ = pushed["slim"]
    att = tmp_path / "slim.att.json"
    attest_after_verify(report(), tag, MANIFEST, str(att))
    subprocess.run([docker_cli(), "rmi", pushed["plain"][0]], capture_output=True)   # only the registry knows it now
    key = str(keys["site"][0])
    err = refused(run_envbuilder("attest", "sign", str(att), "--key", key, "--image", pushed["plain"][1], env=ENV),
                  "digest differs")
    assert pushed["plain"][2] in err, err
    unknown = pushed["plain"][1].rsplit("@", 1)[0] + "@sha256:" + "0" * 64
    refused(run_envbuilder("attest", "sign", str(att), "--key", key, "--image", unknown, env=ENV), "cannot tie")


def test_registry_check_never_passes_a_statement_signed_onto_another_image(pushed, keys, tmp_path):
    """A passing statement attested with cosign itself onto a bare base's digest (what `attest
    sign` refuses): `attest check --image` names it `digest differs`, never `passed verify`; the
    attestation of the right image passes, and another key is `wrong key`, not `no attestation`."""
    tag, ref, ident = pushed["slim"]
    att = tmp_path / "slim.att.json"
    attest_after_verify(report(), tag, MANIFEST, str(att))
    st = json.loads(att.read_text())
    predicate = dict(st["predicate"], verified=st["subject"][0])
    pred = tmp_path / "predicate.json"
    pred.write_text(json.dumps(predicate))
    key, pub = keys["site"]
    proc = subprocess.run(["cosign", "attest", "--key", str(key), "--type", st["predicateType"], "--predicate",
                           str(pred), "--use-signing-config=false", "--tlog-upload=false", "--yes",
                           "--allow-insecure-registry", pushed["plain"][1]], capture_output=True, text=True,
                          env={**os.environ, **ENV}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    err = refused(check(pushed["plain"][1], pub), "attestation: digest differs")
    assert "signed onto another image" in err, err
    r = run_envbuilder("attest", "sign", str(att), "--key", str(key), "--image", ref, env=ENV)
    assert r.code == 0, r.err
    r = check(ref, pub)
    assert r.code == 0 and "[cosign registry attestation]" in r.out, r.err
    refused(check(ref, keys["attacker"][1]), "attestation: wrong key: ")
    unattested = ref.rsplit("@", 1)[0] + "@sha256:" + "1" * 64
    refused(check(unattested, pub), "attestation: no attestation: ")


def test_verify_attest_names_the_bytes_that_ran_and_none_when_the_image_changed_meanwhile(tmp_path):
    """`verify --attest` takes its subject BEFORE the run (attest/commands.py snapshot_subject):
    the statement names the file as verify started it; a file rewritten or replaced while the
    suite ran gets no statement (same size and mtime put back included: the ctime moved)."""
    from envbuilder.attest.commands import snapshot_subject

    image = tmp_path / "x.sif"
    image.write_bytes(os.urandom(4096))
    want = hashlib.sha256(image.read_bytes()).hexdigest()
    before = snapshot_subject(str(image))
    out = tmp_path / "x.att.json"
    msg = attest_after_verify(report(), str(image), MANIFEST, str(out), before=before)
    assert out.is_file() and json.loads(out.read_text())["subject"][0]["digest"]["sha256"] == want, msg
    out.unlink()
    st = image.stat()
    _flip(image, 10)
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    msg = attest_after_verify(report(), str(image), MANIFEST, str(out), before=before)
    assert msg.startswith("no attestation written: ") and "changed while verify ran" in msg, msg
    assert not out.exists()
    replaced = tmp_path / "y.sif"
    replaced.write_bytes(image.read_bytes())
    os.replace(replaced, image)
    assert "changed while verify ran" in attest_after_verify(report(), str(image), MANIFEST, str(out), before=before)
