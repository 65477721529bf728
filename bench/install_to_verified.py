"""From `pipx install` to a verified CPU image, as a new user on this machine (issue 46): each step
timed side by side in one run, with a bare PATH and an empty HOME, nothing but the machine's site
config (/etc/envbuilder/config.toml: the registry mirror, the wheelhouse, the CA bundle).

    python bench/install_to_verified.py                      # cpu-torch-ddp, a cold build (--no-cache)
    python bench/install_to_verified.py --preset cpu-torch-horovod --warm --json out.json

Steps: `python -m build --wheel` of the checkout (not a user's step: the figure a release saves),
`pipx install` of the wheel, `envbuilder build PRESET` (the lock, then Docker; --no-cache unless
--warm: every step anew but the base, which the engine keeps), `envbuilder verify --ranks 2`.
The image is tagged envbuilder-bench/install-PRESET:1 and removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def timed(name: str, argv: list, env: dict, cwd: Path, rows: list, timeout: int = 3600) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    rows.append({"step": name, "seconds": round(time.monotonic() - t0, 1), "exit": proc.returncode})
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"install_to_verified: {name} failed (exit {proc.returncode})")
    return proc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu-torch-ddp")
    p.add_argument("--warm", action="store_true", help="use the engine's build cache (no --no-cache)")
    p.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = p.parse_args(argv)

    rows: list[dict] = []
    tag = f"envbuilder-bench/install-{args.preset}:1"
    with tempfile.TemporaryDirectory(prefix="envbuilder-install-bench-") as tmp:
        top = Path(tmp)
        home, work = top / "home", top / "work"
        home.mkdir()
        work.mkdir()
        env = {"PATH": BARE_PATH, "HOME": str(home)}
        pip_env = {**env, "PIP_CERT": CA_BUNDLE} if os.path.isfile(CA_BUNDLE) else env
        timed("python -m build --wheel", [sys.executable, "-m", "build", "--wheel", "--outdir", top / "dist", REPO],
              {**os.environ}, REPO, rows)
        wheel = next((top / "dist").glob("*.whl"))
        pipx = {**pip_env, "PIPX_HOME": str(top / "pipx"), "PIPX_BIN_DIR": str(top / "bin")}
        timed("pipx install", ["pipx", "install", wheel], pipx, work, rows)
        envbuilder = top / "bin" / "envbuilder"
        try:
            timed(f"envbuilder build {args.preset}" + ("" if args.warm else " --no-cache"),
                  [envbuilder, "build", args.preset, "--tag", tag, *([] if args.warm else ["--no-cache"])], env, work, rows)
            timed("envbuilder verify --ranks 2", [envbuilder, "verify", f"images/{args.preset}", "--ranks", "2"],
                  env, work, rows, timeout=900)
        finally:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, env={"PATH": BARE_PATH})
    total = sum(r["seconds"] for r in rows[1:])
    print(f"{'step':44} {'seconds':>8}")
    for r in rows:
        print(f"{r['step']:44} {r['seconds']:8.1f}")
    print(f"{'pipx install -> verified image (user steps)':44} {total:8.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"preset": args.preset, "warm": args.warm, "steps": rows,
                                               "user_seconds": total}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
