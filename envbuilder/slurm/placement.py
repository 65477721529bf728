"""Where the ranks ran: the `slurm.placement` check of `verify --slurm`.

Every rank of the smoke suite writes its progress file ($OUTPUT_DIR/smoke/rank-N.json) with its
host name; this module reads them and says how many ranks each node ran ("mc-n1: 2 (rank 0,1),
mc-n2: 2 (rank 2,3)"). The check fails when a rank never wrote its file or when the ranks ran
on fewer nodes than the job asked for (a multi-node job that silently ran on one node).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..smoke.common import FAIL, PASS, result

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


def check(workdir: Path, ranks: int, nodes_asked: int) -> dict:
    nodes = ranks_by_node(workdir)
    seen = sorted(r for rs in nodes.values() for r in rs)
    text = describe(nodes) or "no rank wrote its progress file"
    problems = []
    missing = sorted(set(range(ranks)) - set(seen))
    if missing:
        problems.append(f"rank(s) {','.join(map(str, missing))} never started")
    if len(nodes) < nodes_asked:
        problems.append(f"{len(nodes)} node(s) ran ranks, the job asked for {nodes_asked}")
    figure = f"{len(seen)} rank(s) on {len(nodes)} node(s)"
    data = {"ranks_per_node": {h: len(r) for h, r in nodes.items()}, "ranks": nodes}
    if problems:
        return result(NAME, FAIL, "; ".join(problems) + f" ({text})", figure, data)
    return result(NAME, PASS, text, figure, data)
