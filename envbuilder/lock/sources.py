"""Downloaded source tarballs (Horovod's sdist, Open MPI's release tarball): url and sha256.
Which ones: each component says (components/horovod.py, components/mpi.py ``source_tarballs``).

The hashes come from the catalog (each with its source). Where the file's index publishes
hashes (PyPI's JSON simple API), the lock step checks the catalog against it and refuses a
mismatch; the build checks the download itself (``pip --require-hashes``, ``sha256sum -c``).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

from ..errors import CheckFailed

PYPI_SIMPLE = "https://pypi.org/simple"


def _pypi_hashes(project: str, ca_bundle: str | None, timeout: float = 30) -> dict[str, str]:
    ctx = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else ssl.create_default_context()
    req = urllib.request.Request(f"{PYPI_SIMPLE}/{project}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
        data = json.loads(resp.read().decode())
    return {f["filename"]: (f.get("hashes") or {}).get("sha256") for f in data.get("files", [])}


def resolve(wanted: list[dict], ca_bundle: str | None = None) -> list[dict]:
    """Lock entries for the WANTED tarballs (components' source_tarballs(), handed in by the
    pipeline: needs.source_tarballs)."""
    entries = []
    for w in wanted:
        entry = {k: w[k] for k in ("name", "version", "url", "file", "sha256")}
        entry["checked"] = "at build (sha256sum -c)"
        if w["index"] == "pypi":
            try:
                published = _pypi_hashes(w["name"], ca_bundle)
            except (urllib.error.URLError, OSError, ValueError):
                entry["checked"] = "at build (pip --require-hashes); PyPI was not reachable when locking"
            else:
                if w["file"] not in published:
                    raise CheckFailed(f"lock: sources: {w['name']}", f"PyPI has no file {w['file']}",
                                      "check the version in the spec")
                if published[w["file"]] != w["sha256"]:
                    raise CheckFailed(f"lock: sources: {w['name']}",
                                      f"the catalog's sha256 {w['sha256'][:16]}... for {w['file']} does not match "
                                      f"PyPI's {str(published[w['file']])[:16]}...",
                                      "do not build: report it (the catalog or the index changed)")
                entry["checked"] = "against PyPI's published sha256 when locking; at build by pip --require-hashes"
        entries.append(entry)
    return entries
