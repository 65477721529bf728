"""Stack + image plan + rendered files -> manifest.json (also copied into the image for `verify`):
what the image promises (``expect``) and how it was built come from the plan."""

from __future__ import annotations

import hashlib
import json

from .. import __version__
from ..plan.image import Plan
from ..stack import Stack


def image_tag(stack: Stack) -> str:
    return f"envbuilder/{stack.spec.name}:{stack.spec.sha256()[:12]}"


def render_manifest(stack: Stack, plan: Plan, files: dict[str, bytes], smoke_sha: str) -> str:
    spec = stack.spec
    doc = {
        "schema": "envbuilder.manifest/1",
        "name": spec.name,
        "envbuilder": __version__,
        "spec_sha256": spec.sha256(),
        "image": {"tag": image_tag(stack), "base": stack.base, "runtime_base": stack.runtime_base,
                  "os": stack.os_name,
                  **({"arch": spec.target_arch} if spec.target_arch != "x86_64" else {})},
        "expect": plan.expect,
        "build": {
            "mpi_source": stack.mpi_source,
            "horovod_patches": list(plan.horovod_patches),
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
