"""A preset's definition file built by the real Apptainer (.ci/install-apptainer.sh, run through
tools/apptainer-node as the unprivileged user `builder`, with --fakeroot), its .sif verified with 2
ranks under Apptainer, and compared with the Dockerfile's image of the same lock (`envbuilder
compare`: the same Python and OS packages; the files that differ printed). The presets' tests
share it: tests/test_apptainer_presets.py (cpu-torch), tests/test_intel_tf.py,
tests/test_distributed_tf.py; tests/test_apptainer.py has cpu-torch-ddp's and the helpers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from conftest import run_envbuilder
from infra import APPTAINER_NODE, base_image, require_apptainer_node

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BUILDER_UID = 1000          # the user of .ci/install-apptainer.sh's image


def in_apptainer_node(mounts: list[str], *command: str, timeout: int = 600,
                      flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """COMMAND where the real Apptainer is; FLAGS: tools/apptainer-node's own (--host-network, --no-docker)."""
    argv = [str(APPTAINER_NODE), *flags]
    for m in mounts:
        argv += ["-v", m]
    return subprocess.run([*argv, "--", *command], capture_output=True, text=True, timeout=timeout)


def chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            os.lchown(name, uid, uid)


def apptainer_build(recipe: Path, lock: Path, work: Path, *extra: str) -> tuple[Path, subprocess.CompletedProcess, float]:
    """RECIPE with the lock LOCK, built by Apptainer in WORK/<name> (the unprivileged user's folder,
    as on a cluster): (the folder, the build's result, seconds). EXTRA: more build options (the
    wheelhouse's folder is mounted when --wheelhouse names one)."""
    require_apptainer_node()
    base_image()
    out = work / recipe.stem
    out.mkdir(parents=True)
    shutil.copy(lock, out / "envbuilder.lock")
    chown_tree(work, BUILDER_UID)
    mounts = [str(work)]
    if "--wheelhouse" in extra:
        mounts.append(extra[list(extra).index("--wheelhouse") + 1])
    t0 = time.time()
    # a login node with Apptainer alone: no Docker socket; the base (Bootstrap: docker, by the locked
    # digest) comes from the registry, here the set-up's Docker Hub mirror on this machine's loopback
    b = in_apptainer_node(mounts, "python", "-m", "envbuilder", "build", str(recipe), "--out", str(out),
                          "--engine", "apptainer", "--ca-bundle", CA_BUNDLE, *extra, timeout=3600,
                          flags=("--host-network", "--no-docker"))
    return out, b, time.time() - t0


def built_by_apptainer_verified_and_compared(recipe: Path, locked: Path, docker_tag: str, work: Path, *extra: str,
                                             verify_extra: tuple[str, ...] = ()) -> str:
    """LOCKED's lock (an output folder whose Dockerfile's image is DOCKER_TAG) built by Apptainer
    (EXTRA: build options), its %test passed, the .sif verified with 2 ranks under Apptainer and
    compared with DOCKER_TAG (the same Python and OS packages); the .sif removed after. Returns a
    line of figures."""
    out, b, build_s = apptainer_build(recipe, locked / "envbuilder.lock", work, *extra)
    sif = out / f"{json.loads((locked / 'manifest.json').read_text())['name']}.sif"     # the spec's name
    try:
        assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
        assert "Traceback" not in b.stderr
        # a GPU image's %test is left to a GPU node where there is none (--no-gpu: here)
        tested = "(%test: not run, no GPU here" if "--no-gpu" in verify_extra else "(%test: the smoke suite passed)"
        assert f"built {sif} (" in b.stdout and tested in b.stdout, b.stdout
        t0 = time.time()
        v = in_apptainer_node([str(work)], "python", "-m", "envbuilder", "verify", str(out), "--image", str(sif),
                              "--runtime", "apptainer", "--ranks", "2", *verify_extra, timeout=1800)
        verify_s = time.time() - t0
        assert v.returncode == 0, v.stdout[-3000:] + v.stderr[-3000:]
        c = run_envbuilder("compare", str(sif), docker_tag, timeout=900)
        print("\n" + c.out)
        assert c.code == 0, c.out[-3000:] + c.err[-3000:]
        assert "Python packages: the same (" in c.out and "OS packages (dpkg): the same (" in c.out, c.out
        assert f"A (sif): {sif}" in c.out and f"B (docker): {docker_tag}" in c.out, c.out
        return (f"apptainer build (unprivileged, --fakeroot) {build_s:.0f} s, {sif.stat().st_size / 1e6:.0f} MB .sif; "
                f"verify --runtime apptainer --ranks 2 {verify_s:.0f} s")
    finally:
        sif.unlink(missing_ok=True)
