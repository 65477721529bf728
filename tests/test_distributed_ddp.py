"""The CPU torch + DDP preset for real: built on the Docker engine from the local Debian base,
verified with 2 torch.distributed ranks in the container (the suite's own env:// spawner and
torchrun), through job.sbatch on the real one-node Slurm in srun mode and in torchrun mode
(charliecloud), and a deliberately broken image, whose every rank is its own world of size 1,
fails the world-size check naming it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import RECIPES, run_envbuilder
from infra import keep_for_run, base_image, docker_cli, require_binary, require_docker, require_slurm, wheelhouse

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
RECIPE = RECIPES / "cpu-torch-ddp.yaml"

# What breaks "N ranks, one world": something in the image (here a .pth file every Python in
# the venv runs at start-up) that resets each rank's RANK/WORLD_SIZE, and gives it its own port
BREAK_WORLD = (
    "import os, socket; _s = socket.socket(); _s.bind(('127.0.0.1', 0)); "
    "os.environ.get('LOCAL_RANK') is not None and os.environ.update(RANK='0', WORLD_SIZE='1', "
    "LOCAL_RANK='0', LOCAL_WORLD_SIZE='1', MASTER_PORT=str(_s.getsockname()[1])); _s.close()"
)


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([docker_cli(), *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def ddp_image(tmp_path_factory):
    """(folder, tag, build seconds): the preset built by `envbuilder build` (cached layers reused)."""
    require_docker()
    base_image()
    out = tmp_path_factory.mktemp("ddp") / "cpu-torch-ddp"
    probe = run_envbuilder("build", str(RECIPE), "--no-build", "--out", str(out))
    assert probe.code == 0, probe.err
    tag = json.loads((out / "manifest.json").read_text())["image"]["tag"]
    keep_for_run(tag)
    t0 = time.time()
    r = run_envbuilder("build", str(RECIPE), "--out", str(out), "--ca-bundle", CA_BUNDLE,
                       "--wheelhouse", wheelhouse(), timeout=2400)
    assert r.code == 0, r.err[-3000:]
    yield out, tag, time.time() - t0


def verify(*args: str, timeout: int = 600):
    return run_envbuilder("verify", *args, timeout=timeout)


def checks_of(report: Path) -> dict:
    return {c["name"]: c for c in json.loads(report.read_text())["checks"]}


def assert_two_rank_ddp(checks: dict):
    failed = {n: c.get("detail", "")[:300] for n, c in checks.items() if c["status"] == "fail"}
    assert not failed, failed
    init = checks["dist.init[torch]"]
    assert init["figure"] == "2 ranks, gloo" and set(init["ranks"]) == {"0", "1"}
    coll = checks["dist.collectives[torch]"]
    assert coll["status"] == "pass" and coll["figure"] == "60 cases exact"
    train = checks["train.ddp[torch]"]
    assert train["status"] == "pass" and set(train["ranks"]) == {"0", "1"}
    data = train["ranks"]["1"]["data"]
    assert data["loss_after"] < data["loss_before"] * 0.5 and data["ranks_maxdiff_end"] == 0.0
    sizes = checks["perf.allreduce[torch]"]["ranks"]["0"]["data"]["sizes"]
    assert [s["bytes"] for s in sizes] == [4096, 262144, 4194304, 16777216]
    assert all(s["busbw_GBps"] > 0 for s in sizes)
    for name in ("gpu.devices", "gpu.rank_map", "gpu.nccl_allreduce", "gpu.bf16_step"):
        c = checks[f"{name}[torch]"]
        assert c["status"] == "skip" and c["detail"] == "no GPU (CPU image)", c


def test_verify_ddp_image_with_two_ranks_in_the_container(ddp_image, tmp_path):
    folder, tag, build_s = ddp_image
    report = tmp_path / "report.json"
    t0 = time.time()
    r = verify(str(folder), "--runtime", "docker", "--ranks", "2", "--report", str(report))
    wall = time.time() - t0
    assert r.code == 0, r.out + r.err[-3000:]
    assert_two_rank_ddp(checks_of(report))
    assert "OK: cpu-torch-ddp" in r.out
    print(f"cpu-torch-ddp: build {build_s:.0f} s, verify 2 ranks (docker) {wall:.1f} s")


def test_verify_ddp_image_through_torchrun_in_the_container(ddp_image, tmp_path):
    folder, tag, _ = ddp_image
    report = tmp_path / "report.json"
    r = verify(str(folder), "--runtime", "docker", "--ranks", "2", "--launcher", "torchrun",
               "--report", str(report))
    assert r.code == 0, r.out + r.err[-3000:]
    checks = checks_of(report)
    assert_two_rank_ddp(checks)
    assert "torch.distributed.run" in " ".join(checks["launch.pytorch[torch]"]["data"]["command"])


def test_each_rank_its_own_world_fails_the_world_size_check(ddp_image, tmp_path):
    _, tag, _ = ddp_image
    broken = "envbuilder-test/broken:ddp-own-worlds"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {tag}\nRUN printf '%s\\n' \"{BREAK_WORLD}\" > /opt/venv/lib/python3.11/site-packages/zz-own-world.pth\n")
    proc = subprocess.run([docker_cli(), "build", "-q", "-t", broken, str(tmp_path)], capture_output=True,
                          text=True, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    try:
        report = tmp_path / "report.json"
        r = verify("--image", broken, "--runtime", "docker", "--ranks", "2", "--report", str(report),
                   "--timeout", "60")
        assert r.code == 1, r.out + r.err[-2000:]
        checks = checks_of(report)
        init = checks["dist.init[torch]"]
        assert init["status"] == "fail"
        assert "world size 1, expected 2 ranks (every rank is its own world" in init["detail"]
        assert "rank 1: " in init["detail"] and "process group rank 0 but the launcher started rank 1" \
            in init["detail"]
        assert "dist.init[torch]" in r.out and "FAIL" in r.out
        # nothing after a wrong world is reported as passed
        assert checks["train.ddp[torch]"]["status"] != "pass"
    finally:
        docker("rmi", "-f", broken, check=False)


# --------------------------------------------------------------------------- the real Slurm

def verify_slurm(folder: Path, tag: str, tmp_path: Path):
    report = tmp_path / f"report-{time.time_ns()}.json"
    t0 = time.time()
    r = run_envbuilder("verify", str(folder), "--slurm", "--ranks", "2", "--image", tag, "--report", str(report),
                       timeout=1800)
    assert report.is_file(), r.out[-3000:] + r.err[-3000:]
    return r, json.loads(report.read_text()), time.time() - t0


@pytest.fixture
def slurm():
    require_slurm()
    require_binary("srun", "run .ci/install-system.sh and .ci/start-slurm.sh")
    require_binary("ch-run", "apt-get install charliecloud")


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_job_script_runs_ddp_on_slurm(ddp_image, slurm, tmp_path, launcher):
    _, tag, _ = ddp_image
    spec = tmp_path / "spec.yaml"
    spec.write_text(RECIPE.read_text().replace("launcher: srun", f"launcher: {launcher}"))
    folder = tmp_path / "job"
    assert run_envbuilder("build", str(spec), "--no-build", "--out", str(folder)).code == 0
    r, report, wall = verify_slurm(folder, tag, tmp_path)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    assert report["slurm"]["state"] == "COMPLETED"
    checks = {c["name"]: c for c in report["checks"]}
    assert_two_rank_ddp(checks)
    log = Path(report["slurm"]["log"]).read_text()
    if launcher == "torchrun":
        assert "#SBATCH --ntasks-per-node=1" in (folder / "job.sbatch").read_text()
        assert "--rdzv_backend=c10d" in " ".join(checks["launch.pytorch[torch]"]["data"]["command"])
    else:
        assert "srun (in step, 2 tasks)" == report.get("launcher") or "2 rank(s)" in log
    print(f"slurm {launcher} mode: verify --slurm {wall:.1f} s, job {report['slurm']['elapsed_s']} s")
