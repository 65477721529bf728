"""Where each command is explained: the last line of its --help (tests/test_help_docs.py checks
that every page and section named here exists). Paths are relative to the source tree."""

from __future__ import annotations

# command (or "" for `envbuilder --help`) -> the page, and a section of it
DOCS: dict[str, str] = {
    "": "README.md; the guides by task: docs/README.md; every spec key: docs/spec.md",
    "check": "docs/writing-a-spec.md; every key and the rules that read it: docs/spec.md",
    "build": "docs/engines.md; job scripts and site profiles: docs/jobs.md; without Docker or root: docs/login-node.md",
    "sif": "docs/sif.md",
    "compare": "docs/engines.md#comparing-two-images-envbuilder-compare",
    "presets": "docs/writing-a-spec.md#presets-recipes-generated-files-in-images",
    "sites": "docs/jobs.md#site-profiles-envbuilder-sites",
    "schema": "docs/spec.md (the same schema as a page)",
    "verify": "docs/verify.md; --attest: docs/attestation.md",
    "lock": "docs/lock.md; with podman or buildah, rootless: docs/login-node.md",
    "diff": "docs/lock.md",
    "init": "docs/import.md; --preset NAME: docs/writing-a-spec.md (Presets)",
    "export": "docs/import.md#the-way-back-envbuilder-export",
    "attest": "docs/attestation.md",
    "config": "docs/config.md",
    "doctor": "docs/doctor.md",
}


def epilog(command: str = "") -> str:
    return f"Docs: {DOCS[command]}"
