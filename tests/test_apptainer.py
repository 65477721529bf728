"""The definition file built by the real Apptainer (1.4.5, .ci/install-apptainer.sh), as a user
builds it: unprivileged (the user `builder` of tools/apptainer-node, with --fakeroot), the local
base read from a `docker save` archive in the folder (`base_from: docker-archive`, Bootstrap:
docker-archive: a build machine without Docker; the other presets' builds read theirs from the
Docker engine, tests/apptainer_build.py), the CPU torch wheel bound from a wheelhouse and the
network's CA bundle bound for %post, as the file's header says.

cpu-torch-ddp (the cheapest preset with a framework: no compile): locked here with Docker, then
`envbuilder build --engine apptainer` in the Apptainer container: its %test runs the smoke suite,
`envbuilder verify x.sif --runtime apptainer --ranks 2` passes, and `apptainer inspect` shows the
spec's labels. envbuilder's own .sif of the same lock (the Dockerfile's image, written without
Apptainer: `build --sif`) runs the smoke suite under the same Apptainer with 2 ranks, and what
`apptainer inspect` shows of the two (labels, environment, runscript) is compared, every difference
printed. A missing image of .ci/install-apptainer.sh skips (fails in CI)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from apptainer_build import BUILDER_UID, CA_BUNDLE, chown_tree, in_apptainer_node
from conftest import RECIPES, run_envbuilder
from infra import base_image, docker_cli, keep_for_run, require_apptainer_node, wheelhouse

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    require_apptainer_node()
    base_image()
    work = tmp_path_factory.mktemp("apptainer")
    out = work / "cpu-torch-ddp"
    wheels = wheelhouse()
    spec = work / "cpu-torch-ddp.yaml"      # the preset, its base read from an archive of the folder
    spec.write_text((RECIPES / "cpu-torch-ddp.yaml").read_text() + "base_from: docker-archive\n")
    r = run_envbuilder("lock", str(spec), "--out", str(out), "--wheelhouse", wheels,
                       "--ca-bundle", CA_BUNDLE, timeout=900)
    assert r.code == 0, r.err[-2000:]
    # the command the definition file's header prints for it, run where the image is
    probe = run_envbuilder("build", str(spec), "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    save = re.search(r"^#   docker save (\S+) -o (\S+)$", (out / "Apptainer.def").read_text(), re.M)
    assert save and save.group(1).startswith("debian:bookworm-slim@sha256:"), save    # the locked image
    assert save.group(2) == "bases/debian_bookworm-slim.docker.tar", save
    (out / "bases").mkdir()
    subprocess.run([docker_cli(), "save", save.group(1), "-o", str(out / save.group(2))], check=True)
    own = work / "own" / "cpu-torch-ddp"     # the same lock, for the Dockerfile's image and envbuilder's .sif
    own.mkdir(parents=True)
    shutil.copy(out / "envbuilder.lock", own / "envbuilder.lock")
    chown_tree(work, BUILDER_UID)           # the folder is the unprivileged user's, as on a cluster
    t0 = time.time()
    b = in_apptainer_node([str(work), wheels], "python", "-m", "envbuilder", "build",
                          str(spec), "--out", str(out), "--engine", "apptainer",
                          "--wheelhouse", wheels, "--ca-bundle", CA_BUNDLE, timeout=1800)
    build_s = time.time() - t0
    yield work, out, b, build_s, own, spec
    print(f"\ncpu-torch-ddp: apptainer build (unprivileged, --fakeroot) {build_s:.0f} s")


def test_apptainer_builds_the_definition_file_as_its_header_says(built):
    work, out, b, _, _, _ = built
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    assert "Traceback" not in b.stderr
    sif = out / "cpu-torch-ddp.sif"
    assert f"built {sif} (" in b.stdout and "(%test: the smoke suite passed)" in b.stdout
    log = (out / "apptainer-build.log").read_text()
    # the header's command line, unprivileged: --fakeroot, the wheelhouse and the CA bound read-only
    first = log.splitlines()[0]
    assert first.startswith(f"$ cd {out} && /") and first.endswith(
        f"/apptainer build --force --fakeroot --bind {Path(wheelhouse()).resolve()}:/wheelhouse:ro "
        f"--bind {CA_BUNDLE}:/run/secrets/ca:ro cpu-torch-ddp.sif Apptainer.def"), first
    assert "Running setup scriptlet" in log and "doesn't exist in container" not in log
    # %test ran the smoke suite (one rank) inside the new image
    assert "Running testscript" in log and "17 passed, 0 failed" in log
    # apptainer wrote it in a private folder, moved to the folder's cpu-torch-ddp.sif (safewrite.place)
    assert re.search(r"Build complete: \S*/\.cpu-torch-ddp\.sif\.\w+/cpu-torch-ddp\.sif", log), log[-1000:]
    assert not list(out.glob(".cpu-torch-ddp.sif.*")), sorted(p.name for p in out.iterdir())


def test_the_sif_passes_verify_with_two_ranks_under_apptainer(built):
    work, out, b, _, _, _ = built
    assert b.returncode == 0, b.stderr[-2000:]
    sif = out / "cpu-torch-ddp.sif"
    v = in_apptainer_node([str(work)], "python", "-m", "envbuilder", "verify", str(out), "--image", str(sif),
                          "--runtime", "apptainer", "--ranks", "2", "--json")
    assert v.returncode == 0, v.stdout[-3000:] + v.stderr[-3000:]
    report = json.loads(v.stdout)
    assert report["ok"] is True and report["summary"] == {"pass": 17, "fail": 0, "skip": 6}, report["summary"]
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["dist.init[torch]"]["status"] == "pass" and checks["dist.init[torch]"]["figure"] == "2 ranks, gloo"
    assert checks["train.ddp[torch]"]["status"] == "pass"


def test_apptainer_inspect_shows_the_specs_labels_and_no_secret(built):
    work, out, b, _, _, _ = built
    assert b.returncode == 0, b.stderr[-2000:]
    sif = out / "cpu-torch-ddp.sif"
    i = in_apptainer_node([str(work)], "apptainer", "inspect", "--labels", "--json", str(sif))
    assert i.returncode == 0, i.stderr
    labels = json.loads(i.stdout)["data"]["attributes"]["labels"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert labels["org.opencontainers.image.title"] == "cpu-torch-ddp"
    assert labels["dev.envbuilder.spec-sha256"] == manifest["spec_sha256"]
    assert labels["org.label-schema.usage.apptainer.version"].startswith("1.4")
    assert labels["org.label-schema.usage.singularity.deffile.bootstrap"] == "docker-archive"
    # the bind points stay, empty: the CA bundle and the wheels were bound, never copied in
    e = in_apptainer_node([str(work)], "apptainer", "exec", str(sif), "sh", "-c",
                          "test ! -s /run/secrets/ca && test ! -s /run/secrets/netrc && ls -A /wheelhouse | wc -l")
    assert e.returncode == 0 and e.stdout.strip() == "0", e.stdout + e.stderr


def inspect(work: Path, sif: Path) -> dict:
    """What `apptainer inspect` shows of SIF: labels, environment, runscript."""
    shown = {}
    for what in ("labels", "environment", "runscript"):
        i = in_apptainer_node([str(work)], "apptainer", "inspect", f"--{what}", str(sif))
        assert i.returncode == 0, i.stderr
        shown[what] = i.stdout
    return shown


def label_lines(text: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def test_envbuilders_own_sif_runs_under_apptainer_and_inspects_like_apptainers(built):
    """The other way to the .sif, for the same lock: the Dockerfile's image written as a .sif by
    envbuilder (no Apptainer); under Apptainer it runs the smoke suite with 2 ranks, and `apptainer
    inspect` shows the spec's labels as for Apptainer's own build; both hold the same Python and OS
    packages, the same runscript (asserted: `apptainer run` does the same with both); what differs is
    printed (Apptainer's build labels, the environment scripts' text)."""
    work, out, b, _, own, spec = built
    assert b.returncode == 0, b.stderr[-2000:]
    probe = run_envbuilder("build", str(spec), "--no-build", "--out", str(own))
    assert probe.code == 0, probe.err
    keep_for_run(json.loads((own / "manifest.json").read_text())["image"]["tag"])
    t0 = time.time()
    r = run_envbuilder("build", str(spec), "--out", str(own), "--sif",
                       "--wheelhouse", wheelhouse(), "--ca-bundle", CA_BUNDLE, timeout=1800)
    assert r.code == 0, r.err[-3000:]
    print(f"\nDockerfile build + envbuilder's .sif {time.time() - t0:.0f} s")
    chown_tree(own, BUILDER_UID)
    mine, theirs = own / "cpu-torch-ddp.sif", out / "cpu-torch-ddp.sif"
    e = in_apptainer_node([str(work)], "apptainer", "exec", str(mine), "python", "-m", "envbuilder_smoke",
                          "--ranks", "2")
    assert e.returncode == 0, e.stdout[-3000:] + e.stderr[-3000:]
    assert "17 passed, 0 failed, 6 skipped" in e.stdout + e.stderr
    # the same Python and OS packages and files in both, read from the two .sifs (`envbuilder compare`)
    c = run_envbuilder("compare", str(theirs), str(mine), "--json", timeout=900)
    assert c.code == 0, c.out[-3000:] + c.err[-3000:]
    diff = json.loads(c.out)["compare"]
    print(f"Python packages: {diff['python']['same']} the same, OS packages: {diff['dpkg']['same']} the same; files: "
          f"{diff['files']['same']} the same, only in Apptainer's: {[x['path'] for x in diff['files']['only_a']]}, "
          f"only in envbuilder's: {[x['path'] for x in diff['files']['only_b']]}, "
          f"{len(diff['files']['differ'])} differ, the first: {[(x['path'], x['what']) for x in diff['files']['differ']][:12]}")
    assert diff["same_packages"] is True and diff["a"]["from"] == diff["b"]["from"] == "sif"
    assert diff["python"]["same"] >= 10 and diff["dpkg"]["same"] >= 100, diff
    a, o = inspect(work, theirs), inspect(work, mine)
    la, lo = label_lines(a["labels"]), label_lines(o["labels"])
    print("labels only in Apptainer's .sif: " + ", ".join(f"{k}={la[k]}" for k in sorted(set(la) - set(lo))))
    print("labels only in envbuilder's .sif: " + ", ".join(f"{k}={lo[k]}" for k in sorted(set(lo) - set(la))))
    print("labels that differ: " + ", ".join(f"{k}: {la[k]!r} / {lo[k]!r}" for k in sorted(set(la) & set(lo))
                                             if la[k] != lo[k]))
    for what in ("environment", "runscript"):
        print(f"{what}: " + ("the same" if a[what] == o[what] else f"differs\n--- Apptainer's\n{a[what]}"
                             f"--- envbuilder's\n{o[what]}"))
    spec_labels = [k for k in la if k.startswith(("org.opencontainers.image.", "dev.envbuilder."))]
    assert spec_labels and {k: la[k] for k in spec_labels} == {k: lo.get(k) for k in spec_labels}
    # the same runscript, byte for byte: the Dockerfile's CMD, arguments replacing it (quoting.oci_runscript)
    assert a["runscript"] == o["runscript"] and 'set -- python; fi\n    exec "$@"' in a["runscript"], a["runscript"]
    r = [in_apptainer_node([str(work)], "apptainer", "run", str(sif), "python", "-c", "print(6 * 7)")
         for sif in (theirs, mine)]
    assert [x.stdout.strip() for x in r] == ["42", "42"], [x.stderr[-500:] for x in r]


@pytest.mark.parametrize("prepare,device,message", [
    ("true", False, "error: apptainer build --fakeroot: /dev/fuse does not exist"),
    ("sed -i /^builder:/d /etc/subuid", True,
     "error: apptainer --fakeroot rootless: user builder has no subordinate uids in /etc/subuid"),
])
def test_a_missing_prerequisite_of_fakeroot_is_named_before_any_work(tmp_path, prepare, device, message):
    """The Apptainer container started as a site might leave it: no /dev/fuse, or no subordinate
    ids for the user (root takes them away, then the entry drops to `builder`): one message naming
    what the site must allow, exit 2, no traceback, no build started."""
    tag = require_apptainer_node()
    repo = str(RECIPES.parent)
    out = tmp_path / "out"
    tmp_path.chmod(0o777)
    argv = [docker_cli(), "run", "--rm", "--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined",
            "--security-opt", "apparmor=unconfined", "--security-opt", "systempaths=unconfined",
            "-v", f"{repo}:{repo}:ro", "-e", f"PYTHONPATH={repo}", "-v", f"{tmp_path}:{tmp_path}", "-w", repo,
            *(["--device", "/dev/fuse"] if device else []), "--entrypoint", "sh", tag, "-c",
            f'{prepare} && exec /usr/local/bin/apptainer-node-entry "$@"', "sh",
            "python", "-m", "envbuilder", "build", str(RECIPES / "cpu-torch-ddp.yaml"), "--out", str(out),
            "--engine", "apptainer"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and "fix: ask the admins" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (out / "apptainer-build.log").exists()
