"""`envbuilder doctor` on this machine (envbuilder/doctor.py, docs/doctor.md): what it says of the real
Docker engine, Slurm, QEMU and registry mirror matches what those say of themselves; a mirror that
does not answer is named with the fix, and a preset that needs it exits 1; a broken configuration
exits 2."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from conftest import RECIPES, run_envbuilder
from infra import require_docker, require_slurm

from envbuilder import emulation


def _doctor(*args: str, env: dict | None = None):
    return run_envbuilder("doctor", *args, env=env, timeout=180)


def _config(tmp_path: Path, text: str) -> dict:
    (tmp_path / "site.toml").write_text(text)
    return {"ENVBUILDER_CONFIG": str(tmp_path / "site.toml"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def _checks(out: str) -> dict:
    return {c["name"]: c for c in json.loads(out)["checks"]}


def test_doctor_reports_this_machines_docker_and_slurm_with_their_versions(tmp_path):
    require_docker()
    require_slurm()
    server = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                            text=True, timeout=60).stdout.strip()
    sinfo = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=60).stdout.split()[-1]
    r = _doctor(env=_config(tmp_path, ""))
    assert r.code == 0 and "Traceback" not in r.err, r.out + r.err
    lines = {line.split()[1]: line for line in r.out.splitlines() if line and not line.startswith(" ")}
    assert lines["docker"].startswith("ok ") and f"Docker {server} " in lines["docker"], lines["docker"]
    assert "the daemon answers" in lines["docker"] and "BuildKit: " in lines["docker"]
    assert lines["slurm"].startswith("ok ") and f"Slurm {sinfo};" in lines["slurm"], lines["slurm"]
    assert "controller answers" in lines["slurm"]
    mpi_list = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=60)
    if "pmix" in mpi_list.stdout + mpi_list.stderr:
        assert "pmix" in lines["slurm"]
    assert lines["engine"].startswith("ok ") and "docker" in lines["engine"]

    data = json.loads(_doctor("--json", env=_config(tmp_path, "")).out)
    checks = {c["name"]: c for c in data["checks"]}
    assert data["ok"] is True and data["exit"] == 0
    assert set(checks) >= {"docker", "podman", "buildah", "apptainer", "slurm", "mpi", "index", "registry", "qemu",
                           "gpu", "config", "engine"}
    assert checks["docker"]["version"] == server and checks["slurm"]["version"] == sinfo
    assert all(c["status"] in ("ok", "missing", "warn") for c in checks.values())
    assert all(c["fix"] for c in checks.values() if c["status"] == "missing")


def test_an_aarch64_preset_reflects_qemu_here(tmp_path):
    why = emulation.why_not_runnable("aarch64")
    r = _doctor("--preset", "cpu-torch-ddp-aarch64", "--json", env=_config(tmp_path, ""))
    data = json.loads(r.out)
    assert "qemu" in data["needs"] and "aarch64" in data["needs"]["qemu"]
    qemu = _checks(r.out)["qemu"]
    if why is None:
        assert qemu["status"] == "ok" and "qemu" not in data["missing_needed"]
    else:
        assert qemu["status"] == "missing" and why in qemu["detail"] and "qemu-user-static" in qemu["fix"]
        assert r.code == 1 and "qemu" in data["missing_needed"]
    text = _doctor("--preset", "cpu-torch-ddp-aarch64", env=_config(tmp_path, ""))
    assert re.search(r"^(ok|missing)\* +qemu ", text.out, re.M) and "needed by this preset" in text.out


def test_a_mirror_that_does_not_answer_is_missing_and_fails_a_preset_that_needs_the_registry(tmp_path):
    env = _config(tmp_path, 'registry_mirror = "http://127.0.0.1:9"\n')
    r = _doctor("--json", env=env)
    registry = _checks(r.out)["registry"]
    assert registry["status"] == "missing" and "http://127.0.0.1:9" in registry["detail"]
    assert "does not answer" in registry["detail"] and "start the mirror or fix registry_mirror" in registry["fix"]
    # tf-horovod-gpu's base (nvidia/cuda) comes from a registry; a GPU preset needs no GPU to build
    r = _doctor("--preset", "tf-horovod-gpu", env=env)
    assert r.code == 1 and "Traceback" not in r.err, r.out + r.err
    assert re.search(r"^missing\* +registry +the mirror http://127.0.0.1:9 ", r.out, re.M), r.out
    assert "fix: start the mirror or fix registry_mirror" in r.out
    assert re.search(r"^missing: (.*, )?registry(, .*)? \(needed by tf-horovod-gpu\)$", r.err, re.M), r.err
    assert re.search(r"^(ok|warn)\* +gpu ", r.out, re.M)
    # a preset whose base is local to the engine does not need the registry
    local = "local/" in (RECIPES / "cpu-torch-ddp.yaml").read_text()
    data = json.loads(_doctor("--preset", "cpu-torch-ddp", "--json", env=env).out)
    assert ("registry" in data["needs"]) is (not local)


def test_a_broken_config_is_exit_2_with_the_files_line(tmp_path):
    env = _config(tmp_path, 'wheelhouse = "/w"\nregistry_mirorr = "http://127.0.0.1:5000"\n')
    r = _doctor(env=env)
    assert r.code == 2 and "Traceback" not in r.err
    assert f"error: {tmp_path}/site.toml:2: registry_mirorr: not a configuration key" in r.err
    assert re.search(r"^missing +config ", r.out, re.M) and "did you mean registry_mirror?" in r.out
    data = json.loads(_doctor("--json", env=env).out)
    assert data["exit"] == 2 and data["error"]["line"] == 2


def test_an_unknown_preset_names_the_close_ones(tmp_path):
    r = _doctor("--preset", "cpu-torch-dpp", env=_config(tmp_path, ""))
    assert r.code == 2 and "--preset: no preset named 'cpu-torch-dpp'" in r.err and "cpu-torch-ddp" in r.err
    assert "Traceback" not in r.err


def test_a_proxy_that_does_not_answer_is_named_without_its_login(tmp_path):
    env = {**_config(tmp_path, 'ca_bundle = "/etc/ssl/certs/ca-certificates.crt"\n'),
           "HTTPS_PROXY": "http://alice:s3cr3t@127.0.0.1:9", "NO_PROXY": "127.0.0.1,localhost"}
    r = _doctor("--json", env=env)
    index = _checks(r.out)["index"]
    assert index["status"] == "missing" and "via the proxy http://***@127.0.0.1:9" in index["detail"], index
    assert "check the proxy (HTTPS_PROXY)" in index["fix"]
    assert "s3cr3t" not in r.out + r.err
    r = _doctor("--preset", "cpu-torch-ddp", env=env)
    assert r.code == 1 and re.search(r"^missing\* +index ", r.out, re.M), r.out
