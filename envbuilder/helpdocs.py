"""Where each command is explained: the last line of its --help (tests/test_help_docs.py checks
that every page and section named here exists). Paths are relative to the source tree."""

from __future__ import annotations

# command (or "" for `envbuilder --help`) -> the page, and a section of it
DOCS: dict[str, str] = {
    "": "README.md; every spec key: docs/spec.md; the code's layout: docs/architecture.md",
    "check": "docs/spec.md (every key and the rules that read it)",
    "build": "README.md#commands",
    "sif": "README.md#the-sif-without-apptainer-build---sif-targets-sif",
    "presets": "README.md#presets-recipes-generated-files-in-images",
    "schema": "docs/spec.md (the same schema as a page)",
    "verify": "README.md#what-is-checked-here-and-what-only-on-a-cluster",
    "lock": "README.md#the-lock-envbuilderlock",
    "diff": "README.md#the-lock-envbuilderlock",
}


def epilog(command: str = "") -> str:
    return f"Docs: {DOCS[command]}"
