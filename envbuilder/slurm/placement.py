"""Where the ranks ran: the `slurm.placement` check of `verify --slurm`.

Every rank of the smoke suite writes its progress file with its host name
($OUTPUT_DIR/smoke/run<i>-<framework>-<controller>/rank-N.json, one folder per launch); this module reads them and says how many ranks each node ran ("mc-n1: 2 (rank 0,1),
mc-n2: 2 (rank 2,3)"). The check fails when a rank never wrote its file or when the ranks ran
on fewer nodes than the job asked for (a multi-node job that silently ran on one node).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..smoke.common import FAIL, PASS, SKIP, result

NAME = "slurm.placement"


def ranks_by_node(workdir: Path) -> dict[str, list[int]]:
    nodes: dict[str, list[int]] = {}
    for f in workdir.glob("rank-*.json"):
        if f.name.endswith(".exit.json"):
            continue
        try:
            state = json.loads(f.read_text())
            rank, host = int(state["rank"]), str(state["host"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        nodes.setdefault(host, []).append(rank)
    return {host: sorted(ranks) for host, ranks in sorted(nodes.items(), key=lambda kv: min(kv[1]))}


def describe(nodes: dict[str, list[int]]) -> str:
    return ", ".join(f"{host}: {len(r)} (rank {','.join(map(str, r))})" for host, r in nodes.items())


def runs(workdir: Path) -> list[Path]:
    """The suite's launch folders (one per framework and controller), in order."""
    found = [d for d in sorted(workdir.glob("*")) if d.is_dir() and any(d.glob("rank-*.json"))]
    return found or [workdir]


def check(workdir: Path, ranks: int, nodes_asked: int, launched: bool = True) -> dict:
    """``launched``: the suite's report names multi-rank runs; an image with no Horovod and no
    distributed framework runs none, and then there are no ranks to place (skipped, not failed)."""
    per_run = {d.name: ranks_by_node(d) for d in runs(workdir)}
    if not launched and not any(per_run.values()):
        return result(NAME, SKIP, "the image runs no multi-rank pass (no Horovod, no distributed framework): "
                      "no ranks to place", "no ranks")
    first = next(iter(per_run.values()))
    problems = []
    for run, nodes in per_run.items():
        seen = {r for rs in nodes.values() for r in rs}
        missing = sorted(set(range(ranks)) - seen)
        where = f"{run}: " if len(per_run) > 1 else ""
        if missing:
            problems.append(f"{where}rank(s) {','.join(map(str, missing))} never started")
        if len(nodes) < nodes_asked:
            problems.append(f"{where}{len(nodes)} node(s) ran ranks, the job asked for {nodes_asked}")
    text = describe(first) or "no rank wrote its progress file"
    figure = ", ".join(f"{host}: {len(r)}" for host, r in first.items()) or "no ranks"
    data = {"ranks_per_node": {h: len(r) for h, r in first.items()}, "ranks": first,
            "runs": {run: nodes for run, nodes in per_run.items()}}
    if problems:
        return result(NAME, FAIL, "; ".join(problems) + f" ({text})", figure, data)
    return result(NAME, PASS, text, figure, data)
