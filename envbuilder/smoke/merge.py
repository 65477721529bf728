"""Merging a run's per-rank results into the report's checks, naming ranks that crashed or hung.
Standard library only."""

import shlex

from .common import FAIL, PASS, SKIP, describe_exit, result
from .static import framework_key


def merge_run(run, states, exits, events):
    """One list of checks for this run, every rank's result folded in."""
    from .worker import plan
    names = list(plan(run.framework, run.controller, run.first))
    per_name = {}
    for r in range(run.ranks):
        for res in (states.get(r) or {}).get("results", []):
            per_name.setdefault(res["name"], {})[r] = res
            if res["name"] not in names:
                names.append(res["name"])
    failures = [e for e in events.values() if e["kind"] in ("crash", "hang", "never")] or \
        [e for e in events.values() if e["kind"] in ("lost", "killed", "waiting")]
    first_failure = sorted(failures, key=lambda e: e.get("at") or 0)[0]["text"] if failures else ""
    out = []
    for name in names:
        got = per_name.get(name, {})
        missing = [r for r in range(run.ranks) if r not in got]
        if not missing:
            out.append(_fold(name, got))
            continue
        culprits = []
        figure = []
        order = {"crash": 0, "hang": 0, "never": 0, "lost": 1}
        missing.sort(key=lambda r: (order.get(events.get(r, {}).get("kind"), 2), r))
        for r in missing:
            st = states.get(r) or {}
            running = (st.get("running") or {}).get("check")
            if running and (running == name or _same_step(running, name)):
                ev = events.get(r, {})
                culprits.append(ev.get("text") or "rank %d stopped in this check" % r)
                word = {"hang": "hung", "crash": "crashed", "never": "never started"}.get(ev.get("kind"))
                if word:
                    figure.append("rank %d %s" % (r, word))
        if culprits:
            detail = "; ".join(culprits)
            res = result(name, FAIL, detail, ", ".join(figure) or "rank %s stopped" % ",".join(
                str(r) for r in missing))
        elif got and not first_failure:
            res = _fold(name, got)
            res["status"] = FAIL
            res["detail"] = "rank %s did not report (run ended early)" % ",".join(str(r) for r in missing)
        elif got:
            # the other ranks went on after a peer died: their errors are consequences
            res = result(name, SKIP, "not run on rank %s: %s" % (
                ",".join(str(r) for r in missing), first_failure))
        else:
            why = first_failure or run.start_error
            if not why:
                parent = _parent_failure(name, out) or _fatal_failure(out)
                why = ("%s failed" % parent) if parent else "the run ended early"
            res = result(name, SKIP, "not run: %s" % why)
        res["ranks"] = {str(r): _brief(got[r]) for r in sorted(got)}
        out.append(res)
    return out


def _fatal_failure(merged):
    """The failed check after which the ranks stopped (Horovod never started, or went down)."""
    for c in merged:
        if c["status"] != FAIL:
            continue
        fatal = any(((r.get("data") or {}).get("fatal")) for r in (c.get("ranks") or {}).values())
        if fatal or c["name"].startswith("horovod.init"):
            return c["name"]
    return None


def _parent_failure(name, merged):
    """A check that reports several results ran under its first name: if that one failed
    with an error, the others never came."""
    tag = name.split("[")[-1]
    for c in merged:
        if c["status"] == FAIL and c["name"].split("[")[-1] == tag and _same_step(c["name"], name):
            return c["name"]
    return None


def _same_step(running, name):
    """A check that reports several results runs under its first name."""
    if running.startswith("train.") and name.startswith("perf.step."):
        return running.split("[")[-1] == name.split("[")[-1]
    if running.startswith("gpu.devices") and name.startswith("gpu."):
        return running.split("[")[-1] == name.split("[")[-1]
    return False


def _brief(res):
    out = {"status": res.get("status"), "figure": res.get("figure", "")}
    if res.get("data") is not None:
        out["data"] = res["data"]
    if res.get("phases"):
        out["phases"] = res["phases"]
    if res.get("status") == FAIL:
        out["detail"] = res.get("detail", "")
    return out


def _fold(name, got):
    ranks = sorted(got)
    r0 = got[ranks[0]]
    statuses = [got[r]["status"] for r in ranks]
    if FAIL in statuses:
        status = FAIL
        bad = [r for r in ranks if got[r]["status"] == FAIL]
        details = set(got[r].get("detail", "") for r in bad)
        if len(details) == 1 and len(bad) == len(ranks):
            detail = "all ranks: %s" % details.pop()
        else:
            detail = "; ".join("rank %d: %s" % (r, got[r].get("detail", "")) for r in bad)
    elif PASS in statuses:
        status = PASS
        detail = r0.get("detail", "")
    else:
        status = SKIP
        detail = r0.get("detail", "")
    res = result(name, status, detail, r0.get("figure", ""))
    secs = [got[r].get("seconds") for r in ranks if got[r].get("seconds") is not None]
    if secs:
        res["seconds"] = max(secs)
    res["ranks"] = {str(r): _brief(got[r]) for r in ranks}
    return res


def launch_name(run):
    return "launch.%s%s" % (framework_key(run.framework), run.tag)


def launch_check(run, events, log_tail=True):
    name = launch_name(run)
    cmd = " ".join(shlex.quote(c) for c in run.command)
    if run.start_error:
        return result(name, FAIL, run.start_error, "not started")
    figure = "%.1f s wall, %d rank%s" % (run.wall_s, run.ranks, "" if run.ranks == 1 else "s")
    data = {"command": run.command, "returncode": run.returncode, "wall_s": round(run.wall_s, 2),
            "killed": run.killed, "log": run.log_path}
    bad = [e["text"] for e in events.values() if e["kind"] in ("crash", "hang", "never", "lost")]
    if bad or run.killed or run.returncode not in (0, None):
        tail = _log_tail(run.log_path) if log_tail else "(see %s)" % run.log_path
        why = "; ".join(bad) or run.killed or ("launcher %s" % describe_exit(run.returncode))
        data["log_tail"] = tail
        return result(name, FAIL, "%s\ncommand: %s\nlog tail:\n%s" % (why, cmd, tail), figure, data)
    return result(name, PASS, cmd, figure, data)


def _log_tail(path, lines=10):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def operations_check(expect, checks):
    """Every requested tensor operation is built and was used (timeline evidence)."""
    hv = expect.get("horovod") or {}
    want = hv.get("operations") or []
    if not want:
        return None
    build = next((c for c in checks if c["name"] == "horovod.build"), None)
    if build is not None and build["status"] == SKIP:
        # the ranks never got there (a hang or crash in init is named on its own check)
        return result("horovod.operations", SKIP, "not run: horovod.build did not run")
    flags = ((((build or {}).get("ranks") or {}).get("0") or {}).get("data") or {}).get("flags") or {}
    used = set()
    for c in checks:
        if c["name"].startswith("horovod.cpu_ops") and c["status"] == PASS:
            used.update(((((c.get("ranks") or {}).get("0") or {}).get("data") or {}).get("used")) or [])
        if c["name"].startswith("gpu.nccl_allreduce") and c["status"] == PASS:
            used.add("nccl")
    gpu_skipped = any(c["name"].startswith("gpu.nccl_allreduce") and c["status"] == SKIP for c in checks)
    ran = set(c["name"].split("[")[-1].rstrip("]") for c in checks
              if c["name"].startswith("horovod.init[") and c["status"] == PASS)
    problems, notes = [], []
    for op in want:
        built = flags.get("%s_built" % op)
        if not build:
            problems.append("%s: build flags unknown (horovod.build did not run)" % op)
        elif not built:
            problems.append("%s not built" % op)
        elif op in used:
            notes.append("%s built and used" % op)
        elif op == "nccl" and gpu_skipped:
            notes.append("nccl built; not exercised: no GPU")
        elif op in ("mpi", "gloo") and op not in ran:
            notes.append("%s built; not exercised: no run used the %s controller" % (op, op))
        else:
            problems.append("%s built but no allreduce was carried by it" % op)
    if problems:
        return result("horovod.operations", FAIL, "; ".join(problems + notes), "%d problem(s)" % len(problems))
    return result("horovod.operations", PASS, "; ".join(notes), ", ".join(want))
