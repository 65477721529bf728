"""The .sif made without Apptainer (`envbuilder build --sif`, `envbuilder sif`), checked without it:
siftool lists the objects Apptainer writes, the root file system holds /.singularity.d with the
image's environment, the smoke suite passes from the SIF's own SquashFS partition with
charliecloud (2 ranks, locally and through `sbatch job.sbatch` on the real Slurm), two SIFs of one
lock are the same bytes, and bad input (missing tools, a broken image, no room) is one message,
exit 1, no half-written SIF.

The cpu-torch image comes from the engine's build cache when test_build_verify.py built it
before; the SIF itself takes about a minute per copy here."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from apptainer_build import BUILDER_UID, chown_tree, in_apptainer_node
from conftest import RECIPES, run_envbuilder
from infra import (small_tmpfs, keep_for_run, BASE_IMAGE, base_image, docker_cli, require_binary, require_docker, require_slurm,
                   wheelhouse)

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
NAME = "cpu-torch-horovod"


def tools():
    for name, package in (("siftool", "siftool"), ("tar2sqfs", "squashfs-tools-ng"), ("unsquashfs", "squashfs-tools"),
                          ("squashfuse", "squashfuse"), ("ch-run", "charliecloud")):
        require_binary(name, f"apt-get install {package} (.ci/install-system.sh)")


def siftool(*args: str) -> str:
    proc = subprocess.run(["siftool", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_sif(out: Path, *extra: str):
    t0 = time.time()
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(out), "--ca-bundle", CA_BUNDLE,
                       "--wheelhouse", wheelhouse(), "--sif", *extra, timeout=2400)
    assert r.code == 0, r.err[-3000:]
    return r, time.time() - t0


@pytest.fixture(scope="module")
def torch_sif(tmp_path_factory):
    """cpu-torch built by envbuilder (cached layers when the suite built it already) and its SIF."""
    require_docker()
    base_image()
    tools()
    out = tmp_path_factory.mktemp("sif") / "cpu-torch"
    probe = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    keep_for_run(json.loads((out / "manifest.json").read_text())["image"]["tag"])
    r, wall = build_sif(out)
    info = json.loads((out / "image.json").read_text())
    print(f"build --sif: {wall:.0f} s in all")
    yield out, out / f"{NAME}.sif", info, r


# --- format -------------------------------------------------------------------------------------

def test_siftool_lists_what_apptainer_writes(torch_sif):
    out, sif, _, r = torch_sif
    assert f"wrote {sif}" in r.out
    listing = siftool("list", str(sif))
    rows = [l for l in listing.splitlines() if re.match(r"^\d+ +\|", l)]
    types = [row.split("|")[-1].strip() for row in rows]
    assert types == ["Def.FILE", "JSON.Labels", "JSON.Generic", "JSON.Generic", "SBOM (cyclonedx-json)",
                     "FS (Squashfs/*System/amd64)"], listing
    assert all(row.split("|")[1].strip() == "1" for row in rows)          # group 1, as Apptainer
    header = siftool("header", str(sif))
    assert "Launch Script:        #!/usr/bin/env run-singularity" in header
    assert "Primary Architecture: amd64" in header
    # SOURCE_DATE_EPOCH semantics of Apptainer >= 1.5: nil ID, zero times (siftool prints neither)
    assert "ID:" not in header and "Created At:" not in header, header
    assert siftool("dump", "1", str(sif)) == f"bootstrap: docker-daemon\nfrom: {torch_sif[2]['tag']}\n"
    labels = json.loads(siftool("dump", "2", str(sif)))
    assert labels["org.label-schema.usage.singularity.deffile.from"] == torch_sif[2]["tag"]
    manifest = json.loads(siftool("dump", "3", str(sif)))
    assert manifest == json.loads((out / "manifest.json").read_text())
    sbom = json.loads(siftool("dump", "5", str(sif)))
    purls = {c["purl"] for c in sbom["components"]}
    assert any(p.startswith("pkg:pypi/torch@2.13.0") for p in purls)
    assert any(p.startswith("pkg:deb/debian/libopenmpi3@") for p in purls)


def test_root_fs_holds_singularity_d_with_the_image_environment(torch_sif, tmp_path):
    _, sif, info, _ = torch_sif
    from envbuilder.sif import check

    env = json.loads(subprocess.run([docker_cli(), "image", "inspect", info["tag"]], capture_output=True,
                                    text=True, check=True).stdout)[0]["Config"]["Env"]
    offset = check.structure(sif)["partition"]["offset"]
    with check.mounted(sif, offset) as root:
        sd = root / ".singularity.d"
        script = (sd / "env" / "10-docker2singularity.sh").read_text()
        for item in env:
            name, _, value = item.partition("=")
            if name == "PATH":
                assert f'export PATH="{value}"' in script
            else:
                assert f'export {name}="${{{name}:-"{value}"}}"' in script
        for rel in ("env/01-base.sh", "env/90-environment.sh", "env/99-base.sh", "actions/exec",
                    "actions/run", "actions/test", "runscript", "test"):
            assert (sd / rel).stat().st_mode & 0o777 == 0o755, rel
        assert "envbuilder_smoke" in (sd / "test").read_text()
        assert os.readlink(root / "singularity") == ".singularity.d/runscript"
        assert json.loads((sd / "labels.json").read_text())["org.opencontainers.image.architecture"] == "amd64"
        # the environment as `apptainer exec` builds it, from those scripts
        proc = subprocess.run(["ch-run", str(root), "--", "/.singularity.d/actions/exec", "sh", "-c",
                               'echo "$PATH"; command -v python'], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        path = next(item.split("=", 1)[1] for item in env if item.startswith("PATH="))
        assert proc.stdout.splitlines()[0] == path
        assert proc.stdout.splitlines()[1].startswith("/opt/venv/")


def test_compare_reads_the_sif_and_finds_the_images_files(torch_sif):
    """`envbuilder compare x.sif TAG`: the .sif's SquashFS read through squashfuse against the
    Docker image it was written from: the same packages, and every file of the image the same
    bytes in the .sif (the writer adds only what Apptainer expects, which compare leaves out)."""
    _, sif, info, _ = torch_sif
    r = run_envbuilder("compare", str(sif), info["tag"], "--json", timeout=900)
    assert r.code == 0, r.out[-2000:] + r.err[-2000:]
    diff = json.loads(r.out)["compare"]
    assert diff["a"]["from"] == "sif" and diff["b"]["from"] == "docker" and diff["same_packages"] is True
    assert "torch-2" not in json.dumps(diff["python"]["only_a"]) and diff["python"]["same"] >= 10
    assert diff["files"]["differ"] == [] and diff["files"]["only_b"] == [], diff["files"]
    assert diff["files"]["same"] > 10_000
    assert "/.singularity.d" in diff["not_compared"]


# --- running the content ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sif_verified(torch_sif, tmp_path_factory):
    """`verify x.sif --ranks 2 --attest x.sif.att.json`, once: the report, the attestation beside
    the SIF (written because the run passed: docs/attestation.md) and a cosign key pair of the
    site's, made by cosign (tests make keys; envbuilder never does)."""
    _, sif, _, _ = torch_sif
    work = tmp_path_factory.mktemp("sif-verify")
    report = work / "report.json"
    att = Path(f"{sif}.att.json")
    t0 = time.time()
    r = run_envbuilder("verify", str(sif), "--ranks", "2", "--report", str(report), "--attest", str(att),
                       timeout=900)
    wall = time.time() - t0
    keys = None
    if shutil.which("cosign"):
        subprocess.run(["cosign", "generate-key-pair"], cwd=work, capture_output=True, env={**os.environ, **COSIGN_ENV},
                       check=True, timeout=60)
        keys = (work / "cosign.key", work / "cosign.pub")
    return r, report, att, keys, wall


COSIGN_ENV = {"COSIGN_PASSWORD": ""}


def test_verify_sif_runs_the_suite_from_its_squashfs_with_two_ranks(torch_sif, sif_verified):
    _, sif, _, _ = torch_sif
    r, report, att, _, wall = sif_verified
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    data = json.loads(report.read_text())
    checks = {c["name"]: c for c in data["checks"]}
    assert not [c for c in checks.values() if c["status"] == "fail"], checks
    assert checks["allreduce.exact[mpi]"]["status"] == "pass"
    assert checks["train.pytorch[mpi]"]["status"] == "pass"
    assert data["verify"]["runtime"] == "charliecloud"
    assert data["sif"]["partition"]["arch"] == "amd64"
    assert f"(charliecloud, SIF {sif})" in r.out
    # the run passed: its attestation names the SIF's bytes and what passed
    st = json.loads(att.read_text())
    assert st["subject"][0]["digest"]["sha256"] == sha256(sif)
    assert st["predicate"]["summary"] == data["summary"] and st["predicate"]["result"] == "passed"
    assert st["predicate"]["stack"]["id"].startswith("lock:")
    # build wrote its provenance: the SIF it made, from these inputs
    prov = json.loads((torch_sif[0] / "provenance.intoto.json").read_text())
    assert prov["predicateType"] == "https://envbuilder.dev/attestation/build/v1"
    assert prov["subject"][0]["digest"]["sha256"] == sha256(sif)
    assert prov["predicate"]["stack"]["id"] == st["predicate"]["stack"]["id"]
    assert set(prov["predicate"]["inputs"]["files"]) == {"Dockerfile", "Apptainer.def", "envbuilder.lock"}
    assert prov["predicate"]["engine"] == "docker"
    print(f"verify x.sif: {wall:.0f} s")


def test_sif_attestation_signed_with_cosign_checks(torch_sif, sif_verified):
    require_binary("cosign", "bash .ci/install-cosign.sh")
    out, sif, _, _ = torch_sif
    _, _, att, keys, _ = sif_verified
    t0 = time.time()
    r = run_envbuilder("attest", "sign", str(att), "--key", str(keys[0]), "--image", str(sif), env=COSIGN_ENV)
    assert r.code == 0, r.err
    t1 = time.time()
    r = run_envbuilder("attest", "check", "--image", str(sif), "--key", str(keys[1]), "--folder", str(out))
    assert r.code == 0 and "attestation ok:" in r.out, r.err
    print(f"attest sign (cosign bundle): {t1 - t0:.1f} s; attest check of the {sif.stat().st_size >> 20} MiB SIF: "
          f"{time.time() - t1:.1f} s")


def gate_on_the_apptainer_cluster(sif: Path, pub: Path, lock: Path) -> None:
    """job.sbatch's gate in the apptainer form on the 2-node Apptainer cluster (Slurm 24.11, real
    Apptainer on every node, no cosign there): the signed SIF starts on 2 nodes with `require`; the
    start delay against `attestation: "off"`; an unsigned copy is refused with exit 2, nothing run."""
    from infra import APPTAINER_CLUSTER_ROOT, apptainer_sbatch_until_done, require_apptainer_cluster

    require_apptainer_cluster()
    shared = Path(APPTAINER_CLUSTER_ROOT) / "shared" / "tests" / f"attest-{os.getpid()}-{time.strftime('%H%M%S')}"
    shared.mkdir(parents=True)
    try:
        shutil.copy(sif, shared / "signed.sif")
        shutil.copy(pub, shared / "site.pub")
        site = (Path(__file__).resolve().parent.parent / "sites" / "minicluster-apptainer.yaml").read_text()
        for policy in ("require", '"off"'):
            profile = shared / f"site-{policy.strip(chr(34))}.yaml"
            profile.write_text(site + f"\nattestation: {policy}\nattestation_keys: [{shared / 'site.pub'}]\n")
            r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out",
                               str(shared / f"job-{policy.strip(chr(34))}"), "--site", str(profile), "--lock", str(lock))
            assert r.code == 0, r.err
        chown_tree(shared, BUILDER_UID)
        walls = {}
        for policy in ("off", "require", "off", "require"):
            folder = shared / f"job-{policy}"
            t0 = time.time()
            code, job_id, err = apptainer_sbatch_until_done(
                ["--nodes", "2", "--ntasks-per-node", "1", "job.sbatch", "hostname"], folder,
                env={"ENVBUILDER_IMAGE": str(shared / "signed.sif")}, timeout=300)
            walls.setdefault(policy, []).append(time.time() - t0)
            log = (folder / f"cpu-torch-horovod-{job_id}.out").read_text()
            assert code == 0, log[-2000:] + err
            assert ("attestation ok:" in log) == (policy == "require"), log[-2000:]
        print(f"2-node job, submit to end: gate off {min(walls['off']):.1f} s, require {min(walls['require']):.1f} s")
        # an unsigned copy of the same SIF: refused before any rank
        shutil.copy(shared / "signed.sif", shared / "unsigned.sif")
        subprocess.run(["siftool", "del", "8", str(shared / "unsigned.sif")], capture_output=True, check=True)
        os.lchown(shared / "unsigned.sif", BUILDER_UID, BUILDER_UID)
        code, job_id, _ = apptainer_sbatch_until_done(
            ["--nodes", "2", "--ntasks-per-node", "1", "job.sbatch", "hostname"], shared / "job-require",
            env={"ENVBUILDER_IMAGE": str(shared / "unsigned.sif")}, timeout=300)
        log = (shared / "job-require" / f"cpu-torch-horovod-{job_id}.out").read_text()
        assert code == 2 and "envbuilder: error: attestation: no attestation: " in log and "ac-n" not in log, log[-2000:]
        print(log.strip().splitlines()[-1])
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_sif_attestation_in_apptainers_signed_group(torch_sif, sif_verified, tmp_path):
    """apptainer sif add (group 1) + apptainer sign with an Ed25519 PEM key, as the non-root user:
    apptainer verify alone proves the file system and the attestation; one byte changed in the
    attestation object is refused (exit 2, one message)."""
    from infra import require_apptainer_node

    require_apptainer_node()
    out, sif, _, _ = torch_sif
    _, _, att, _, _ = sif_verified
    work = tmp_path / "asign"
    work.mkdir()
    shutil.copy(sif, work / "x.sif")
    shutil.copy(att, work / "x.sif.att.json")
    for name, cmd in (("key.pem", ["openssl", "genpkey", "-algorithm", "ed25519", "-out"]),):
        subprocess.run([*cmd, str(work / name)], check=True, capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", str(work / "key.pem"), "-pubout", "-out", str(work / "pub.pem")],
                   check=True, capture_output=True)
    stack = json.loads(att.read_text())["predicate"]["stack"]["id"]
    chown_tree(work, BUILDER_UID)
    script = (f"cd {work} && t0=$(date +%s%N) && python -m envbuilder attest sign x.sif.att.json --key key.pem "
              f"--image x.sif --format apptainer && t1=$(date +%s%N) && "
              f"python -m envbuilder attest check --image x.sif --key pub.pem --format apptainer --stack {stack} && "
              "t2=$(date +%s%N) && apptainer verify --key pub.pem x.sif && "
              'echo "figures: sign $(( (t1 - t0) / 1000000 )) ms, check $(( (t2 - t1) / 1000000 )) ms"')
    proc = in_apptainer_node([str(work)], "bash", "-c", script, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[apptainer signed group]" in proc.stdout and "Verified signature(s)" in proc.stdout + proc.stderr
    print(next(l for l in proc.stdout.splitlines() if l.startswith("figures:")))
    gate_on_the_apptainer_cluster(work / "x.sif", work / "pub.pem", out / "envbuilder.lock")
    # one byte of the attestation object changed in the file
    data = (work / "x.sif").read_bytes()
    at = data.rindex(b'"pass": ')
    with open(work / "x.sif", "r+b") as fh:
        fh.seek(at + 8)
        fh.write(b"9")
    proc = in_apptainer_node([str(work)], "bash", "-c",
                             f"cd {work} && python -m envbuilder attest check --image x.sif --key pub.pem --format apptainer",
                             timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "attestation: digest differs: x.sif changed after it was signed" in proc.stderr
    assert "Traceback" not in proc.stderr
    print(proc.stderr.strip().splitlines()[0])


def test_sbatch_job_runs_the_sif_with_charliecloud(torch_sif, sif_verified, tmp_path):
    """The job of a site that requires an attestation (docs/attestation.md): the gate checks the
    SIF's signed attestation in the batch step, then the ranks run."""
    require_slurm()
    require_binary("cosign", "bash .ci/install-cosign.sh")
    out, sif, _, _ = torch_sif
    _, _, att, keys, _ = sif_verified
    if not Path(f"{att}.bundle").is_file():
        r = run_envbuilder("attest", "sign", str(att), "--key", str(keys[0]), "--image", str(sif), env=COSIGN_ENV)
        assert r.code == 0, r.err
    site = tmp_path / "gated.yaml"
    site.write_text(f"name: gated\nruntime: charliecloud\nattestation: require\nattestation_keys: [{keys[1]}]\n")
    folder = tmp_path / "job"
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(folder),
                       "--site", str(site), "--lock", str(out / "envbuilder.lock"))
    assert r.code == 0, r.err
    report = tmp_path / "slurm-report.json"
    t0 = time.time()
    r = run_envbuilder("verify", str(folder), "--slurm", "--ranks", "2", "--image", str(sif),
                       "--report", str(report), timeout=900)
    assert report.is_file(), r.out[-2000:] + r.err[-3000:]
    data = json.loads(report.read_text())
    failed = [(c["name"], c.get("detail", "")[:300]) for c in data["checks"] if c["status"] == "fail"]
    assert r.code == 0 and not failed, failed or r.err[-3000:]
    names = {c["name"]: c for c in data["checks"]}
    assert names["horovod.init[mpi]"]["figure"] == "2 ranks, mpi controller"
    assert set(names["train.pytorch[mpi]"]["ranks"]) == {"0", "1"}
    log = Path(data["slurm"]["log"]).read_text()
    assert "mounted the SquashFS partition of" in log
    gate = next(l for l in log.splitlines() if "attestation ok:" in l)
    assert log.index("attestation ok:") < log.index("mounted the SquashFS partition of")
    print(gate)
    print(f"verify --slurm with the SIF: {time.time() - t0:.0f} s, job {data['slurm']['elapsed_s']} s")


def test_registry_round_trip_attested_by_digest(torch_sif, sif_verified, tmp_path):
    """The cpu-torch image verified, pushed to the loopback registry by digest, attested there with
    cosign, pulled back by that digest and checked on the pulled image; the tag then moved to
    another image: the old attestation does not carry over (replay)."""
    from infra import require_registry

    registry = require_registry()
    require_binary("cosign", "bash .ci/install-cosign.sh")
    out, _, info, _ = torch_sif
    _, _, _, keys, _ = sif_verified
    docker = docker_cli()
    att = tmp_path / "image.att.json"
    t0 = time.time()
    r = run_envbuilder("verify", str(out), "--image", info["tag"], "--ranks", "2", "--launcher", "mpi",
                       "--attest", str(att), timeout=900)
    assert r.code == 0 and att.is_file(), r.out[-2000:] + r.err[-2000:]
    t_verify = time.time() - t0
    repo = f"{registry}/envbuilder-tests/cpu-torch-horovod"
    tag = f"{repo}:run-{os.getpid()}"
    subprocess.run([docker, "tag", info["tag"], tag], check=True, capture_output=True)
    try:
        t0 = time.time()
        push = subprocess.run([docker, "push", tag], capture_output=True, text=True, timeout=900)
        assert push.returncode == 0, push.stderr
        t_push = time.time() - t0
        digest = re.search(r"digest: (sha256:[0-9a-f]{64})", push.stdout).group(1)
        ref = f"{repo}@{digest}"
        t0 = time.time()
        r = run_envbuilder("attest", "sign", str(att), "--key", str(keys[0]), "--image", ref, env=COSIGN_ENV)
        assert r.code == 0, r.err
        t_sign = time.time() - t0
        subprocess.run([docker, "rmi", tag], check=True, capture_output=True)
        pull = subprocess.run([docker, "pull", ref], capture_output=True, text=True, timeout=600)
        assert pull.returncode == 0, pull.stderr
        t0 = time.time()
        r = run_envbuilder("attest", "check", "--image", ref, "--key", str(keys[1]), "--folder", str(out),
                           "--pulled", ref)
        assert r.code == 0 and "[cosign registry attestation]" in r.out, r.err
        print(f"registry: verify {t_verify:.0f} s, push {t_push:.0f} s, cosign attest {t_sign:.1f} s, "
              f"check on the pulled image {time.time() - t0:.1f} s")
        # the tag rebuilt (here: another image pushed under it): its new digest has no attestation
        subprocess.run([docker, "tag", BASE_IMAGE, tag], check=True, capture_output=True)
        push = subprocess.run([docker, "push", tag], capture_output=True, text=True, timeout=600)
        assert push.returncode == 0, push.stderr
        moved = f"{repo}@" + re.search(r"digest: (sha256:[0-9a-f]{64})", push.stdout).group(1)
        r = run_envbuilder("attest", "check", "--image", moved, "--key", str(keys[1]), "--folder", str(out))
        assert r.code == 2 and "attestation: no attestation" in r.err and "Traceback" not in r.err, r.err
        print(r.err.splitlines()[0])
    finally:
        subprocess.run([docker, "rmi", tag], capture_output=True)
        subprocess.run([docker, "rmi", ref], capture_output=True)


def test_build_push_records_the_registry_digest(torch_sif, tmp_path):
    """`build --push REF` (the lock of the module's build, so the engine's cache makes it in
    seconds; a tag of its own, so the module's image keeps its ID): the registry's digest in
    image.json and in the build's provenance, and the registry serves that digest."""
    from infra import require_registry

    registry = require_registry()
    out, _, _, _ = torch_sif
    tag = f"envbuilder-tests/pushed:{os.getpid()}"
    ref = f"{registry}/envbuilder-tests/pushed:{os.getpid()}"
    folder = tmp_path / "pushed"
    try:
        r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(folder), "--lock",
                           str(out / "envbuilder.lock"), "--tag", tag, "--ca-bundle", CA_BUNDLE,
                           "--wheelhouse", wheelhouse(), "--push", ref, timeout=2400)
        assert r.code == 0, r.err[-3000:]
        pushed = json.loads((folder / "image.json").read_text())["pushed"]
        assert pushed["ref"] == ref and re.fullmatch(r"sha256:[0-9a-f]{64}", pushed["digest"])
        assert pushed["pinned"] == f"{registry}/envbuilder-tests/pushed@{pushed['digest']}"
        assert f"pushed {ref}: {pushed['pinned']}" in r.out
        prov = json.loads((folder / "provenance.intoto.json").read_text())
        assert prov["predicate"]["image"]["pushed"] == pushed
        pull = subprocess.run([docker_cli(), "pull", pushed["pinned"]], capture_output=True, text=True, timeout=600)
        assert pull.returncode == 0, pull.stderr
    finally:
        for name in (ref, tag):
            subprocess.run([docker_cli(), "rmi", name], capture_output=True)


def test_build_push_refuses_a_bad_reference_before_building(tmp_path):
    for ref, words in (("127.0.0.1:5000/x@sha256:" + "0" * 64, "is not a registry/repository[:tag]"),
                       ("UPPER/case", "is not a registry/repository[:tag]")):
        r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "o"), "--push", ref)
        assert r.code == 2 and words in r.err and "--push" in r.err and "Traceback" not in r.err, r.err
        assert not (tmp_path / "o").exists()
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "o"), "--engine", "apptainer",
                       "--push", "127.0.0.1:5000/x:1")
    assert r.code == 2 and "the apptainer engine cannot push here yet" in r.err, r.err


# --- bit-identical --------------------------------------------------------------------------------

def test_two_sifs_of_one_lock_are_the_same_bytes(torch_sif, tmp_path):
    out, sif, _, _ = torch_sif
    second = tmp_path / "again"
    _, wall = build_sif(second, "--lock", str(out / "envbuilder.lock"))
    assert sha256(second / f"{NAME}.sif") == sha256(sif)
    print(f"second build --sif from the lock: {wall:.0f} s")


# --- bad input ------------------------------------------------------------------------------------

@pytest.fixture
def small_folder(tmp_path):
    """An output folder whose image is the small local base (a SIF of it takes seconds)."""
    base_image()
    folder = tmp_path / "deb"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"name": "deb", "expect": {}, "image": {"tag": BASE_IMAGE}}))
    return folder


def _path_without(tmp_path: Path, missing: str) -> str:
    """A PATH holding the tools this step uses except MISSING (links to the real ones)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "tar2sqfs", "siftool", "squashfuse", "fusermount3"):
        real = shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
        if name != missing and real:
            (bin_dir / name).symlink_to(real)
    return str(bin_dir)


@pytest.mark.parametrize("missing,package", [("siftool", "siftool"), ("tar2sqfs", "squashfs-tools-ng")])
def test_missing_tool_names_the_debian_package(small_folder, tmp_path, missing, package):
    r = run_envbuilder("sif", str(small_folder), env={"PATH": _path_without(tmp_path, missing)})
    assert r.code == 1, r.err
    assert f"{missing} is not installed (Debian package {package})" in r.err
    assert "Traceback" not in r.err
    assert sorted(p.name for p in small_folder.iterdir()) == ["manifest.json"]


def test_build_sif_checks_tools_before_building(tmp_path):
    """Before the lock, the folder and an hour of build: the SIF's tools are checked first, and an
    existing folder is left as it was."""
    out = tmp_path / "out"
    assert run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(out), "--no-build").code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(out), "--sif",
                       env={"PATH": _path_without(tmp_path, "siftool")})
    assert r.code == 1 and "siftool is not installed (Debian package siftool)" in r.err
    assert "resolving" not in r.err and not list(out.glob("*.sif"))
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_broken_image_is_one_message_and_keeps_the_existing_sif(small_folder, tmp_path):
    tools()
    existing = small_folder / "deb.sif"
    existing.write_bytes(b"an earlier SIF")
    bad = tmp_path / "broken.tar"
    (tmp_path / "notes.txt").write_text("not an image\n")
    subprocess.run(["tar", "-cf", str(bad), "-C", str(tmp_path), "notes.txt"], check=True)
    r = run_envbuilder("sif", str(small_folder), "--archive", str(bad))
    assert r.code == 1, r.err
    assert "sif: image:" in r.err and "neither manifest.json (docker save) nor index.json" in r.err
    assert "Traceback" not in r.err
    assert existing.read_bytes() == b"an earlier SIF"
    assert sorted(p.name for p in small_folder.iterdir()) == ["deb.sif", "manifest.json"]
    r = run_envbuilder("sif", str(small_folder), "--image", "envbuilder/no-such-image:sif")
    assert r.code == 1 and "is not in the Docker engine" in r.err, r.err


def test_no_room_is_one_message_and_no_partial_sif(small_folder, tmp_path):
    tools()
    with small_tmpfs(tmp_path / "small", "8m") as small:
        folder = small / "deb"
        shutil.copytree(small_folder, folder)
        r = run_envbuilder("sif", str(folder))
        assert r.code == 1, r.err
        assert re.search(r"no room: [\d.]+ GB free under .*, making the SIF needs about", r.err), r.err
        assert sorted(p.name for p in folder.iterdir()) == ["manifest.json"]


def test_sif_takes_the_tag_the_build_gave_the_image(small_folder):
    """`build --tag T` records T in image.json; `envbuilder sif FOLDER` writes the .sif of that image,
    not of the manifest's default tag (issue 47: it read the manifest's)."""
    tools()
    tag = "envbuilder-test/sif-by-tag:1"
    docker = docker_cli()
    subprocess.run([docker, "rmi", "-f", tag], capture_output=True)
    (small_folder / "image.json").write_text(json.dumps({"engine": "docker", "tag": tag}))
    r = run_envbuilder("sif", str(small_folder))
    assert r.code == 1 and f"image {tag} is not in the Docker engine" in r.err, r.err
    subprocess.run([docker, "tag", BASE_IMAGE, tag], check=True, capture_output=True)
    try:
        r = run_envbuilder("sif", str(small_folder))
        assert r.code == 0, r.err[-2000:]
        assert (small_folder / "deb.sif").is_file()
    finally:
        subprocess.run([docker, "rmi", tag], capture_output=True)


def test_sif_of_the_small_base_image_round_trips(small_folder):
    """The whole path on a small image: `envbuilder sif`, then `verify`'s structure check."""
    tools()
    r = run_envbuilder("sif", str(small_folder), "--json", timeout=600)
    assert r.code == 0, r.err
    info = json.loads(r.out)
    from envbuilder.sif import check

    objects = check.structure(Path(info["sif"]))["objects"]
    assert [o["name"] for o in objects] == ["definition", "labels.json", "envbuilder-manifest.json",
                                            "oci-config.json", "sbom.cdx.json", "rootfs.squashfs"]
    # the same image from a `docker save` archive: the same root file system, byte for byte
    again = small_folder.parent / "from-archive"
    again.mkdir()
    shutil.copy(small_folder / "manifest.json", again)
    archive = small_folder.parent / "image.tar"
    subprocess.run([docker_cli(), "save", "-o", str(archive), BASE_IMAGE], check=True)
    r2 = run_envbuilder("sif", str(again), "--archive", str(archive), "--json", timeout=600)
    assert r2.code == 0, r2.err
    first, second = Path(info["sif"]), again / "deb.sif"
    assert siftool("dump", "1", str(second)) == "bootstrap: docker-archive\nfrom: image.tar\n"
    # the partition holds .singularity.d/Singularity, which names the source: compare the rest
    listing = [[line for line in subprocess.run(
        ["unsquashfs", "-lln", "-o", str(check.structure(p)["partition"]["offset"]), str(p)],
        capture_output=True, text=True, check=True).stdout.splitlines()[1:]
        if not line.endswith((".singularity.d/Singularity", ".singularity.d/labels.json"))]
        for p in (first, second)]
    assert listing[0] == listing[1] and len(listing[0]) > 1000
    # the Apptainer runtime itself cannot run here: verify prints the command for a cluster node
    r = run_envbuilder("verify", info["sif"], "--runtime", "apptainer")
    assert r.code == 2 and "apptainer (or singularity) is not installed" in r.err
    assert f"apptainer exec --nv {info['sif']} python -m envbuilder_smoke --json --ranks 2" in r.err
