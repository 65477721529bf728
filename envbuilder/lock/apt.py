"""OS packages: exact versions, resolved against the base image's own package index.

A throw-away container of the locked base image runs ``apt-get update`` and
``apt-get install --simulate --no-install-recommends`` for each stage's packages: every package
the stage would install (the requested ones and all their dependencies) with the version apt
picks today, plus the requested ones the base already has (at their installed version). The
.deb's sha256 comes from the index (``apt-cache show``); apt checks it against the signed index
when it installs. The image installs exactly these versions (``pins/apt-STAGE.txt``).

Debian and Ubuntu drop superseded versions from their main archives: a lock whose versions are
gone fails the build at the apt step (re-lock with ``--update NAME``), or point the base at a
snapshot archive (snapshot.debian.org, snapshot.ubuntu.com) for long-term rebuilds.
"""

from __future__ import annotations

import re

from ..errors import CheckFailed
from ..quoting import shell_words

INST_RE = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) .*\[([^\]]+)\]\)")


def _script(stages: dict[str, list[str]]) -> str:
    lines = [
        "set -e",
        "export DEBIAN_FRONTEND=noninteractive",
        "apt-get update -qq > /tmp/update.log 2>&1 || { cat /tmp/update.log >&2; exit 3; }",
        'echo "@@APT $(apt-get --version | head -n 1)"',
        'for f in /var/lib/apt/lists/*Release; do [ -f "$f" ] && echo "@@INDEX ${f##*/} '
        '$(grep -m1 "^Date:" "$f" | cut -d" " -f2-)"; done',
    ]
    for stage, pkgs in stages.items():
        names = shell_words([p.split("=")[0] for p in pkgs], "packages.apt")
        req = shell_words(pkgs, "packages.apt")
        lines += [
            f'echo "@@STAGE {stage}"',
            f"apt-get install -s --no-install-recommends {req} > /tmp/sim 2>/tmp/sim.err "
            "|| { echo \"@@FAIL\"; cat /tmp/sim.err; }",
            "grep '^Inst ' /tmp/sim || true",
            'echo "@@INSTALLED"',
            f"dpkg-query -W -f='${{Package}} ${{Version}} ${{Architecture}}\\n' {names} 2>/dev/null || true",
            'echo "@@SHOW"',
            "pins=$(grep '^Inst ' /tmp/sim | sed -E 's/^Inst ([^ ]+) (\\[[^]]*\\] )?\\(([^ ]+) .*/\\1=\\3/')",
            f"inst=$(dpkg-query -W -f='${{Package}}=${{Version}}\\n' {names} 2>/dev/null || true)",
            "[ -z \"$pins$inst\" ] || apt-cache show $pins $inst 2>/dev/null "
            "| grep -E '^(Package|Version|SHA256):' || true",
        ]
    return "\n".join(lines) + "\n"


def parse(output: str, stages: dict[str, list[str]]) -> tuple[dict[str, list[dict]], dict]:
    """The container's output -> ({stage: [entries]}, {apt version, index dates})."""
    result: dict[str, list[dict]] = {}
    meta = {"apt": None, "index": {}}
    stage = None
    part = None
    current: dict = {}
    sha: dict[tuple[str, str], str] = {}
    failed: dict[str, list[str]] = {}
    for raw in output.splitlines():
        line = raw.rstrip()
        if line.startswith("@@APT "):
            meta["apt"] = line[6:].strip()
        elif line.startswith("@@INDEX "):
            _, name, *date = line.split(" ", 2)
            meta["index"][name] = date[0] if date else ""
        elif line.startswith("@@STAGE "):
            stage, part = line.split()[1], "sim"
            result[stage] = []
        elif line == "@@FAIL":
            part = "fail"
        elif line == "@@INSTALLED":
            part = "installed"
        elif line == "@@SHOW":
            part = "show"
        elif part == "fail":
            if line.startswith("E:"):
                failed.setdefault(stage, []).append(line[2:].strip())
        elif part == "sim":
            m = INST_RE.match(line)
            if m:
                result[stage].append({"name": m.group(1), "version": m.group(2), "arch": m.group(3)})
        elif part == "installed":
            bits = line.split()
            if len(bits) == 3 and not any(e["name"] == bits[0] for e in result[stage]):
                result[stage].append({"name": bits[0], "version": bits[1], "arch": bits[2], "in_base": True})
        elif part == "show":
            key, _, value = line.partition(": ")
            if key == "Package":
                current = {"name": value}
            elif key == "Version":
                current["version"] = value
            elif key == "SHA256" and "version" in current:
                sha.setdefault((current["name"], current["version"]), value)
    for stage, msgs in failed.items():
        raise CheckFailed(f"lock: apt.{stage}", f"apt cannot install {' '.join(stages[stage])}: {'; '.join(msgs)}",
                          "check the package names and versions exist for the base image's OS release")
    for stage_entries in result.values():
        for e in stage_entries:
            e["sha256"] = sha.get((e["name"], e["version"]))
        stage_entries.sort(key=lambda e: e["name"])
    return result, meta


def resolve(engine, image: str, stages: dict[str, list[str]]) -> tuple[dict[str, list[dict]], dict]:
    """Run the simulation in ``image`` (an ID or a pinned reference) with ``engine`` (lock/engine.py)."""
    stages = {s: p for s, p in stages.items() if p}
    if not stages:
        return {}, {"apt": None, "index": {}}
    try:
        out = engine.run(image, ["sh", "-c", _script(stages)])
    except RuntimeError as exc:
        raise CheckFailed("lock: apt", f"resolving OS packages in {image} with {engine.name} failed: "
                          f"{str(exc).strip()[-400:]}",
                          "the base image needs apt and a reachable package archive") from None
    return parse(out, stages)


def pins_text(entries: list[dict]) -> str:
    """One name=version per line: what ``xargs apt-get install`` reads."""
    return "".join(f"{e['name']}={e['version']}\n" for e in sorted(entries, key=lambda e: e["name"]))
