"""py-rattler's solve, run by ``envbuilder lock`` in a process of its own (lock/conda.py ``resolve``):
py-rattler 0.28's runtime threads can crash the interpreter as it exits (SIGSEGV or abort after the
work is done, seen here in about one run of three), so this process prints its result and leaves
with os._exit, and the lock's own process never loads py-rattler.

    python rattler_solve.py '{"specs": [...], "channels": [...], "platforms": [...]}'

prints one JSON object: {"ok": true, "records": [conda-lock package entries]} or {"ok": false,
"error": "..."}. Reads only its argument; stdlib + py-rattler.
"""

import asyncio
import json
import os
import sys


def entry(rec, platform):
    deps = {}
    for dep in rec.depends:
        name, _, spec = dep.partition(" ")
        deps[name] = spec.strip() or "*"
    return {"name": rec.name.normalized, "version": str(rec.version), "manager": "conda", "platform": platform,
            "dependencies": deps, "url": rec.url,
            "hash": {"sha256": rec.sha256.hex(), **({"md5": rec.md5.hex()} if rec.md5 else {})},
            "category": "main", "optional": False}


def main(argv):
    args = json.loads(argv[1])
    try:
        import rattler

        records = asyncio.run(rattler.solve(sources=[rattler.Channel(c) for c in args["channels"]],
                                            specs=args["specs"], platforms=args["platforms"]))
        out = {"ok": True, "records": [entry(r, args["platforms"][0]) for r in records]}
    except Exception as exc:  # noqa: BLE001 - rattler raises its own types (SolverError, FetchRepoDataError, ...)
        out = {"ok": False, "error": (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]}
    return out


if __name__ == "__main__":
    result = main(sys.argv)
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
