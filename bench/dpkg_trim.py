"""What the runtime stage's dpkg trim (/etc/dpkg/dpkg.cfg.d/envbuilder-trim, plan/components/system.py
DPKG_TRIM) saves, and that it leaves what a job needs.

Per preset: the runtime stage's OS-package step exactly as images/PRESET/Dockerfile renders it,
built on the local Debian base twice in one run, once as rendered (trim) and once without the two
lines that write the dpkg config (no trim); the image's size as Docker reports it (uncompressed,
base included) and the size of that one layer. In the trimmed image: every package's copyright
file, the CA bundle, /usr/share/zoneinfo/UTC and the C.UTF-8 locale are checked to be there, and
/usr/share/man, /usr/share/doc (less copyright files) and /usr/share/locale (less locale.alias) to
hold no file more than the base image does (the base's own files are left: see DPKG_TRIM's comment).

    python bench/dpkg_trim.py [--presets cpu-torch-ddp,cpu-torch-horovod] [--json FILE]   # ~1 min each

Images are tagged localhost/envbuilder-bench/trim-*, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from envbuilder.plan.components.system import DPKG_TRIM_FILE  # noqa: E402

TITLE = "# system: OS packages the image needs at run time (no compilers)"
BASE = "local/debian:bookworm"

# run in the trimmed image; prints KEY=VALUE lines
PROBE = r"""
set -u
pkgs=$(dpkg-query -W -f '${Package}\n' | wc -l)
missing=0
for p in $(dpkg-query -W -f '${Package}\n'); do
  d=/usr/share/doc/$p
  # a package whose copyright the base image already had, or a multi-arch name, is looked up plainly
  [ -e "$d/copyright" ] || [ -e "/usr/share/doc/${p%%:*}/copyright" ] || [ -L "$d" ] || missing=$((missing+1))
done
echo packages=$pkgs
echo copyright_missing=$missing
echo ca=$(test -s /etc/ssl/certs/ca-certificates.crt && echo yes || echo no)
echo zoneinfo=$(test -e /usr/share/zoneinfo/UTC && echo yes || echo no)
echo c_utf8=$(LC_ALL=C.UTF-8 python3 -c 'import locale; print(locale.setlocale(locale.LC_ALL, ""))' 2>&1)
echo man_files=$(find /usr/share/man -type f 2>/dev/null | wc -l)
echo doc_files=$(find /usr/share/doc -type f ! -name copyright 2>/dev/null | wc -l)
echo locale_files=$(find /usr/share/locale -type f ! -name locale.alias 2>/dev/null | wc -l)
"""


def runtime_step(preset: str) -> str:
    """The RUN instruction of the runtime stage's OS-package step, from the rendered Dockerfile."""
    text = (REPO / "images" / preset / "Dockerfile").read_text()
    part = text.split(TITLE, 1)[1]
    m = re.search(r"^RUN .*?(?<!\\)\n", part, re.M | re.S)
    assert m, f"no RUN after the runtime OS step in images/{preset}/Dockerfile"
    return m.group(0)


def untrimmed(run: str) -> str:
    lines = [ln for ln in run.split("\n") if DPKG_TRIM_FILE not in ln]
    first = lines[0]
    assert first.startswith("RUN mkdir -p /etc/dpkg/dpkg.cfg.d"), first
    lines[1] = "RUN " + lines[1].split("&& ", 1)[1]
    return "\n".join(lines[1:])


def docker(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, **kw)


def build(tag: str, run: str) -> dict:
    with tempfile.TemporaryDirectory() as ctx:
        Path(ctx, "Dockerfile").write_text(f'FROM {BASE}\nSHELL ["/bin/bash", "-o", "pipefail", "-c"]\n{run}')
        subprocess.run(["docker", "build", "-q", "-t", tag, ctx], check=True, capture_output=True, text=True,
                       env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin:/usr/local/bin"})
    size = int(docker("image", "inspect", "-f", "{{.Size}}", tag).stdout)
    layer = int(docker("history", "--format", "{{.Size}}", "--human=false", tag).stdout.split()[0])
    return {"image_bytes": size, "layer_bytes": layer}


def probe(tag: str) -> dict:
    out = docker("run", "--rm", "--network", "none", "--entrypoint", "bash", tag, "-c", PROBE).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="cpu-torch-ddp,cpu-torch-horovod")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows, tags = [], []
    base = probe(BASE)
    try:
        for preset in args.presets.split(","):
            run = runtime_step(preset)
            row = {"preset": preset}
            for kind, text in (("trim", run), ("plain", untrimmed(run))):
                tag = f"localhost/envbuilder-bench/trim-{preset}:{kind}"
                tags.append(tag)
                row[kind] = build(tag, text)
            row["checks"] = probe(tags[-2])
            row["plain_checks"] = probe(tags[-1])
            rows.append(row)
    finally:
        for tag in tags:
            subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
    mb = 1e6
    print(f"{'preset':<20} {'layer no trim':>14} {'layer trim':>11} {'image no trim':>14} {'image trim':>11} {'saved':>8}")
    for r in rows:
        p, t = r["plain"], r["trim"]
        print(f"{r['preset']:<20} {p['layer_bytes'] / mb:>11.1f} MB {t['layer_bytes'] / mb:>8.1f} MB "
              f"{p['image_bytes'] / mb:>11.1f} MB {t['image_bytes'] / mb:>8.1f} MB "
              f"{(p['image_bytes'] - t['image_bytes']) / mb:>5.1f} MB")
    counts = ("man_files", "doc_files", "locale_files")
    print(f"\nfiles the step adds to the base's (base {BASE}: "
          + " ".join(f"{k}={base.get(k)}" for k in counts) + ")")
    for r in rows:
        for kind, c in (("no trim", r["plain_checks"]), ("trim", r["checks"])):
            print(f"{r['preset']:<20} {kind:<8} " + " ".join(f"{k}=+{int(c[k]) - int(base[k])}" for k in counts))
    for r in rows:
        print(f"{r['preset']} (trimmed): " + " ".join(f"{k}={v}" for k, v in r["checks"].items()
                                                      if k not in counts))
    if args.json:
        Path(args.json).write_text(json.dumps({"base": base, "rows": rows}, indent=2) + "\n")
    bad = [r["preset"] for r in rows
           if r["checks"].get("copyright_missing") != "0" or r["checks"].get("ca") != "yes"
           or r["checks"].get("zoneinfo") != "yes" or r["checks"].get("c_utf8") != "C.UTF-8"
           or any(r["checks"][k] != base[k] for k in counts)]
    if bad:
        print("FAILED checks: " + ", ".join(bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
