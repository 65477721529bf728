"""Stack + rendered files -> manifest.json (also copied into the image for `verify`)."""

from __future__ import annotations

import hashlib
import json

from .. import __version__
from ..components import cuda, framework, horovod, mpi
from ..resolve import Stack


def image_tag(stack: Stack) -> str:
    return f"envbuilder/{stack.spec.name}:{stack.spec.sha256()[:12]}"


def expected(stack: Stack) -> dict:
    spec = stack.spec
    pins = {}
    for req in spec.packages.pip:
        name, _, version = req.partition("==")
        pins[name.split("[")[0].lower()] = version
    lock = stack.lock
    if lock is not None:
        # every locked Python package: the smoke suite's drift check compares them all
        pins = lock.pip_versions()
    out = {
        "python": stack.python,
        "framework": framework.expect(stack),
        "horovod": horovod.expect(stack),
        "mpi": mpi.expect(stack),
        **cuda.expect(stack),
        "packages": dict(sorted(pins.items())),
        **cuda.expect_pypi(stack),
    }
    if stack.cpu_threads_env:
        out["cpu_env"] = framework.cpu_env(stack)
    dist = spec.canonical().get("distributed")
    if dist:
        # how the ranks talk (torch.distributed: its backend and launcher); absent for specs
        # that only name horovod, whose manifests stay as they were
        out["distributed"] = {"kind": dist["kind"], "backend": spec.torch_backend,
                              "launcher": dist.get("launcher")}
    if lock is not None:
        # OS packages of the final stage, name -> version (for a dpkg drift check)
        stage = "runtime" if "runtime" in lock.apt else "devel"
        out["apt"] = {e["name"]: e["version"] for e in lock.apt.get(stage, [])}
        out["conda"] = {p["name"]: p["version"] for p in lock.conda_packages()} or None
    return out


def render_manifest(stack: Stack, files: dict[str, bytes], smoke_sha: str) -> str:
    spec = stack.spec
    doc = {
        "schema": "envbuilder.manifest/1",
        "name": spec.name,
        "envbuilder": __version__,
        "spec_sha256": spec.sha256(),
        "image": {"tag": image_tag(stack), "base": stack.base, "runtime_base": stack.runtime_base,
                  "os": stack.os_name,
                  **({"arch": spec.target_arch} if spec.target_arch != "x86_64" else {})},
        "expect": expected(stack),
        "build": {
            "mpi_source": stack.mpi_source,
            "horovod_patches": [name for name, _ in horovod.patches(stack)],
            "framework_index_url": stack.framework_index_url,
            # the base's pip constraint file every pip step installed under (NGC PyTorch >= 25.03)
            **({"pip_constraint": stack.pip_constraint} if stack.pip_constraint else {}),
        },
        "findings": [f.as_dict() for f in stack.findings],
        **({"lock": _lock_record(stack.lock)} if stack.lock is not None else {}),
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
        "smoke_suite_sha256": smoke_sha,
        "spec": spec.canonical(),
    }
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def _lock_record(lock) -> dict:
    """What the image was built from: the lock's digest, its time, the base images by digest."""
    return {"sha256": lock.sha256(), "resolved_at": lock.resolved_at,
            "base": {stage: b["digest"] for stage, b in sorted(lock.base.items())},
            "counts": {"apt": sum(len(v) for v in lock.apt.values()), "pip": len(lock.pip_entries()),
                       "sources": len(lock.sources), "conda": len(lock.conda_packages())}}
