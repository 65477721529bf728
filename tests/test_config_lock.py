"""The configuration where it meets a real lock (envbuilder/config.py, lockcmd.py): a site's
wheelhouse is a source of wheels, not a demand. Needs Docker (the base and OS packages) and PyPI."""

from __future__ import annotations

from conftest import RECIPES, run_envbuilder
from test_config import _files


def test_a_configured_wheelhouse_with_the_cpu_torch_is_left_out_of_a_gpu_lock(tmp_path):
    """This machine's site config names the wheelhouse holding torch 2.13.0+cpu; a GPU preset that
    pins torch 2.13.0 (CUDA from PyPI) then locks PyPI's CUDA build, saying why, instead of the
    refusal --wheelhouse gets (tests/test_lock_variant.py): a configured folder is a source of
    wheels, not a demand. Real resolution: Docker for the base and apt, pip against PyPI."""
    from infra import TORCH_WHEEL, base_image, require_docker, wheelhouse

    from envbuilder.lock.model import load

    require_docker()
    spec = RECIPES / "torch-ddp-pypi.yaml"
    if "local/" in spec.read_text():
        base_image()
    env = _files(tmp_path, site=f'wheelhouse = "{wheelhouse()}"\nca_bundle = "/etc/ssl/certs/ca-certificates.crt"\n')
    r = run_envbuilder("lock", str(spec), "--out", str(tmp_path / "o"), env=env, timeout=900)
    assert r.code == 0 and "Traceback" not in r.err, r.err[-3000:]
    assert (f"note: the wheelhouse {wheelhouse()} (site config {tmp_path}/site/config.toml:1) holds the wrong build "
            "of pytorch for this spec: locking without it") in r.err
    entries = {e["name"]: e for e in load(tmp_path / "o" / "envbuilder.lock").pip_entries()}
    assert entries["torch"]["version"] == "2.13.0" and entries["torch"]["file"] != TORCH_WHEEL
    assert entries["torch"].get("from") != "wheelhouse" and any(n.startswith("nvidia-") for n in entries)
