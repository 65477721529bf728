"""envbuilder against hpccm and a plain Dockerfile, on the same stack and the same engine.

For each stack (torch: recipes/cpu-torch-horovod.yaml, tf: recipes/cpu-tf-horovod.yaml) and each builder
(envbuilder, hpccm: bench/hpccm_recipe.py, plain: bench/plain/Dockerfile.STACK) it measures:

  size      image size (docker image inspect .Size) and its ratio to the payload (bench/payload.py,
            measured inside the image)
  cold      `docker build --no-cache` with the base image present (extra pip pin six==1.16.0)
  rebuild   the build after changing that one pin to six==1.17.0, with the cold build's cache
  verify    `envbuilder verify --image TAG --ranks 2` wall time (median of --repeat runs)
  overhead  the smoke training's step time in the container / on the host (/opt/envbuilder-smoke-venv):
            --overhead-pairs pairs of runs (mpirun) in ABBA order, median of the pair ratios
  render    `envbuilder build PRESET --no-build` for every recipe (median of --render-repeat)

All three builds run through the same BuildKit CLI, with the same CA secret and wheelhouse.
envbuilder's own steps before the docker build (lock, render) are timed separately.

    python bench/bench.py                       # everything, both stacks (about 1 h 30 here)
    python bench/bench.py --stacks torch --builders envbuilder
    python bench/bench.py --no-cold             # skip the cold builds (uses the cache)
    python bench/bench.py --render-only         # only the --no-build timings (seconds)
    python bench/bench.py --overhead-only       # only the overhead pairs, images from the cache
    python bench/bench.py --table bench/results.json   # print the table of saved results
    python bench/bench.py --dry-run             # the table from fake measurements (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
STACKS = {
    "torch": {"recipe": "recipes/cpu-torch-horovod.yaml", "name": "cpu-torch-horovod"},
    "tf": {"recipe": "recipes/cpu-tf-horovod.yaml", "name": "cpu-tf-horovod"},
}
BUILDERS = ("envbuilder", "hpccm", "plain")
PINS = ("six==1.16.0", "six==1.17.0")      # the extra pin, before and after the rebuild
HOST_PYTHON = "/opt/envbuilder-smoke-venv/bin/python"
# A build that fails with one of these lost the engine, not a step: BuildKit 20.10's client session
# under load (moby/buildkit#2367), or dockerd restarted by someone else on a shared machine.
LOST_ENGINE = ("no active session", "unexpected EOF", "Cannot connect to the Docker daemon")
NOISE = 0.10      # pair ratios whose middle half is wider than this cannot tell a 5 % overhead
GOALS = {"ratio": 1.15, "rebuild_share": 0.15, "verify_s": 60.0, "overhead": 1.05, "render_s": 1.0}


# ---- measuring ------------------------------------------------------------------------------

def load() -> float:
    return round(os.getloadavg()[0], 2)


def run(cmd, log: Path | None = None, env=None, stdin=None, check=True) -> tuple[float, str]:
    """(seconds, output) of a command; the output also goes to LOG."""
    started = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, input=stdin, errors="replace")
    seconds = time.monotonic() - started
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write("$ " + " ".join(map(str, cmd)) + f"\n{proc.stdout}\n# exit {proc.returncode}, "
                    f"{seconds:.1f} s\n")
    if check and proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-25:])
        raise RuntimeError(f"{' '.join(map(str, cmd[:4]))} ... failed ({proc.returncode}):\n{tail}")
    return seconds, proc.stdout


def engine():
    """envbuilder's Docker engine module: the CLI and build command envbuilder itself uses."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from envbuilder.engines import docker

    return docker


def docker_cli() -> list[str]:
    return engine().buildkit_cli()


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = 0
    try:
        mem = int(next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal"))) // 1024 ** 2
    except (OSError, StopIteration):
        pass
    docker = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                            capture_output=True, text=True).stdout.strip()
    return {"cpus": os.cpu_count(), "cpu": cpu, "mem_gib": mem, "kernel": platform.release(),
            "os": _os_name(), "docker_engine": docker, "python": platform.python_version()}


def _os_name() -> str:
    try:
        return next(l.split("=", 1)[1].strip().strip('"') for l in open("/etc/os-release")
                    if l.startswith("PRETTY_NAME="))
    except (OSError, StopIteration):
        return platform.platform()


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="envbuilder-bench-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.cli = docker_cli()
        self.env = dict(os.environ, DOCKER_BUILDKIT="1")
        self.py = sys.executable
        self.host_bindings: dict[str, bool] = {}

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} load {load():5.2f}] {msg}", file=sys.stderr, flush=True)

    # -- contexts: one folder per builder, a Dockerfile, wheelhouse/, the smoke suite
    def _wheels(self, ctx: Path) -> None:
        wh = ctx / "wheelhouse"
        wh.mkdir(exist_ok=True)
        for wheel in sorted(Path(self.args.wheelhouse).glob("*.whl")):
            if not (wh / wheel.name).exists():
                try:
                    os.link(wheel, wh / wheel.name)
                except OSError:
                    shutil.copy2(wheel, wh / wheel.name)

    def _suite(self, stack: str, ctx: Path) -> None:
        """The smoke suite and the preset's manifest (no lock: no package expectations), copied
        into the hpccm and plain contexts exactly as envbuilder's folder holds them."""
        src = REPO / "images" / STACKS[stack]["name"]
        shutil.copy2(src / "manifest.json", ctx / "manifest.json")
        if (ctx / "envbuilder_smoke").exists():
            shutil.rmtree(ctx / "envbuilder_smoke")
        shutil.copytree(src / "envbuilder_smoke", ctx / "envbuilder_smoke",
                        ignore=shutil.ignore_patterns("__pycache__"))

    def prepare(self, stack: str, builder: str, pin: str, log: Path) -> tuple[Path, float]:
        """The build context for PIN; seconds spent by the builder's own tool before docker."""
        ctx = self.work / stack / builder
        ctx.mkdir(parents=True, exist_ok=True)
        tool_s = 0.0
        if builder == "envbuilder":
            spec = self.work / stack / f"{stack}-spec.yaml"
            text = (REPO / STACKS[stack]["recipe"]).read_text()
            spec.write_text(text.replace("\ntargets:", f'\npackages: {{pip: ["{pin}"]}}\ntargets:', 1))
            lock = self.work / stack / "envbuilder.lock"
            ca = ["--ca-bundle", self.args.ca_bundle] if self.args.ca_bundle else []
            s1, _ = run([self.py, "-m", "envbuilder", "lock", str(spec), "--lock", str(lock),
                         "--wheelhouse", self.args.wheelhouse, *ca], log)
            s2, _ = run([self.py, "-m", "envbuilder", "build", str(spec), "--lock", str(lock),
                         "--out", str(ctx), "--no-build"], log)
            tool_s = s1 + s2
        elif builder == "hpccm":
            s, out = run([self.args.hpccm, "--recipe", str(BENCH / "hpccm_recipe.py"), "--format", "docker",
                          "--userarg", f"framework={stack}", "pip=" + pin.replace("==", ":")], log)
            (ctx / "Dockerfile").write_text(out if out.endswith("\n") else out + "\n")
            self._suite(stack, ctx)
            tool_s = s
        else:
            text = (BENCH / "plain" / f"Dockerfile.{stack}").read_text()
            assert PINS[0] in text, "the plain Dockerfile must pin " + PINS[0]
            (ctx / "Dockerfile").write_text(text.replace(PINS[0], pin))
            self._suite(stack, ctx)
        self._wheels(ctx)
        return ctx, tool_s

    def build(self, ctx: Path, tag: str, log: Path, no_cache: bool) -> dict:
        """Seconds and how many steps came from the cache. A build that lost the engine
        (LOST_ENGINE) is retried once, with the same options (a --no-cache build stays cold),
        and marked."""
        cmd = engine().docker_build_command(self.cli, ctx, tag, self.args.ca_bundle)   # what envbuilder runs
        if no_cache:
            cmd.insert(-1, "--no-cache")
        retried = False
        while True:
            try:
                seconds, out = run(cmd, log, env=self.env)
                break
            except RuntimeError as exc:
                if retried or not any(m in str(exc) for m in LOST_ENGINE):
                    raise
                self.log("build lost its BuildKit session or the engine restarted; retrying once")
                self.wait_for_engine()
                retried = True
        return {"s": round(seconds, 1), "cached_steps": cached_steps(out), "retried": retried,
                "pin_step_cached": pin_step_cached(out)}

    def wait_for_engine(self, seconds: int = 300) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if subprocess.run([self.cli[0], "info"], capture_output=True).returncode == 0:
                return
            time.sleep(5)

    def inspect(self, tag: str, field: str) -> str | None:
        proc = subprocess.run([self.cli[0], "image", "inspect", "--format", "{{.%s}}" % field, tag],
                              capture_output=True, text=True)
        return proc.stdout.strip() or None if proc.returncode == 0 else None

    def image_size(self, tag: str) -> int:
        return int(self.inspect(tag, "Size"))

    def payload(self, tag: str, log: Path) -> dict:
        _, out = run([self.cli[0], "run", "--rm", "-i", "--network", "none", "--entrypoint", "python3", tag, "-"],
                     log, stdin=(BENCH / "payload.py").read_text())
        return json.loads(out.strip().splitlines()[-1])

    def verify(self, tag: str | None, stack: str, log: Path, host: bool = False, launcher: str | None = None) -> dict:
        report = self.work / "verify-report.json"
        if report.exists():
            report.unlink()
        manifest = REPO / "images" / STACKS[stack]["name"] / "manifest.json"
        if host:
            cmd = [self.py, "-m", "envbuilder", "verify", "--runtime", "host", "--python", self.args.host_python,
                   "--manifest", str(manifest)]
        else:
            cmd = [self.py, "-m", "envbuilder", "verify", "--image", tag, "--runtime", "docker",
                   "--manifest", str(manifest)]
        if launcher:
            cmd += ["--launcher", launcher]
        started_load = load()
        seconds, _ = run(cmd + ["--ranks", "2", "--report", str(report)], log, check=False)
        data = json.loads(report.read_text()) if report.exists() else {}
        return {"wall_s": round(seconds, 2), "ok": bool(data.get("ok")), "summary": data.get("summary"),
                "trains": trains(data), "step_ms": step_ms(data), "load": [started_load, load()]}

    def rmi(self, tag: str) -> None:
        subprocess.run([self.cli[0], "rmi", "-f", tag], capture_output=True)

    # -- one stack, one builder
    def builder(self, stack: str, builder: str) -> dict:
        log = self.work / f"{stack}-{builder}.log"
        tag = f"envbuilder-bench/{stack}-{builder}:latest"
        out: dict = {"stack": stack, "builder": builder, "tag": tag, "log": str(log)}
        before, after = self.args.pins
        ctx, tool_s = self.prepare(stack, builder, before, log)
        out["tool_s"] = round(tool_s, 2)
        self.log(f"{stack}/{builder}: {'cold' if self.args.cold else 'cached'} build")
        out["cold_load"] = [load()]
        first = self.build(ctx, tag, log, no_cache=self.args.cold)
        out["cold_load"].append(load())
        out["first_build"] = first
        if first["cached_steps"] == 0:
            out["cold_s"] = first["s"]          # nothing came from the cache: a cold build
        ctx, tool_s = self.prepare(stack, builder, after, log)
        out["rebuild_tool_s"] = round(tool_s, 2)
        self.log(f"{stack}/{builder}: rebuild after {before} -> {after}")
        out["rebuild_load"] = [load()]
        first_id = self.inspect(tag, "Id")
        out["rebuild"] = self.build(ctx, tag, log, no_cache=False)
        if first_id and first_id != self.inspect(tag, "Id"):
            self.rmi(first_id)               # the cold build's image, untagged by the rebuild
        if not out["rebuild"]["pin_step_cached"]:
            out["rebuild_s"] = out["rebuild"]["s"]
        out["pins"] = [before, after]
        out["rebuild_load"].append(load())
        out["size_bytes"] = self.image_size(tag)
        out["payload"] = self.payload(tag, log)
        self.log(f"{stack}/{builder}: verify x{self.args.repeat}" + (", each followed by a host run"
                                                                      if builder == "envbuilder" else ""))
        out["verify"], out["host"] = [], []
        on_host = builder == "envbuilder" and self.host_binding(stack)
        for _ in range(self.args.repeat):      # host runs interleaved: load drift hits both alike
            out["verify"].append(self.verify(tag, stack, log))
            if on_host:
                out["host"].append(self.verify(None, stack, self.work / f"{stack}-host.log", host=True))
        out["overhead"] = self.overhead(tag, stack, log)
        if not self.args.keep_images:
            self.rmi(tag)
        return out

    def host_binding(self, stack: str) -> bool:
        """Whether the host environment has this stack's Horovod binding: .ci/make-smoke-venv.sh
        takes Horovod from the cpu-torch image (PyTorch binding only), so the tf stack has no host
        side, hence no overhead figure (said once)."""
        if stack not in self.host_bindings:
            module = "horovod.torch" if stack == "torch" else "horovod.tensorflow"
            ok = subprocess.run([HOST_PYTHON, "-c", f"import {module}"], capture_output=True).returncode == 0
            if not ok:
                self.log(f"{stack}: {HOST_PYTHON} has no {module}: no host runs, no container overhead figure")
            self.host_bindings[stack] = ok
        return self.host_bindings[stack]

    def overhead(self, tag: str, stack: str, log: Path) -> dict | None:
        """The smoke training's step time in the container against the host, in pairs run back to
        back in ABBA order (container-host, host-container, ...), so that load that drifts during
        the pairs hits both sides alike. mpirun only: a pair takes about 15 s here. None: the host
        has no Horovod binding for this stack."""
        if not self.host_binding(stack):
            return None
        n = self.args.overhead_pairs
        self.log(f"{stack}: container overhead, {n} pairs")
        host_log = self.work / f"{stack}-host.log"
        pairs = []
        for i in range(n):
            sides = {}
            for side in (("container", "host") if i % 2 == 0 else ("host", "container")):
                run_ = self.verify(None if side == "host" else tag, stack, host_log if side == "host" else log,
                                   host=side == "host", launcher="mpi")
                sides[side] = run_["step_ms"]
            pairs.append({"container_ms": sides["container"], "host_ms": sides["host"]})
        return {"launcher": "mpi", "pairs": pairs, **overhead_figures(pairs)}

    def overhead_of_cached(self, stack: str, builder: str) -> dict | None:
        """Rebuild the image of an earlier run from the cache (its last pin) and measure the overhead."""
        log = self.work / f"{stack}-{builder}.log"
        tag = f"envbuilder-bench/{stack}-{builder}:latest"
        ctx, _ = self.prepare(stack, builder, self.args.pins[1], log)
        self.log(f"{stack}/{builder}: build from the cache")
        self.build(ctx, tag, log, no_cache=False)
        try:
            return self.overhead(tag, stack, log)
        finally:
            if not self.args.keep_images:
                self.rmi(tag)

    def host(self, stack: str) -> list[dict]:
        log = self.work / f"{stack}-host.log"
        self.log(f"{stack}: host runs x{self.args.repeat}")
        return [self.verify(None, stack, log, host=True) for _ in range(self.args.repeat)]

    def render(self) -> dict:
        self.log(f"render: every preset x{self.args.render_repeat}")
        out = {}
        for recipe in sorted((REPO / "recipes").glob("*.yaml")):
            folder = self.work / "render" / recipe.stem
            times = []
            for _ in range(self.args.render_repeat):
                seconds, _ = run([self.py, "-m", "envbuilder", "build", str(recipe), "--no-build",
                                  "--out", str(folder)], self.work / "render.log")
                times.append(seconds)
            out[recipe.name] = {"median_s": round(statistics.median(times), 3),
                                "max_s": round(max(times), 3), "runs": len(times)}
        return out


def cached_steps(log: str) -> int:
    """Steps BuildKit took from its cache, FROM lines left out (a base image present locally is
    always "CACHED", with --no-cache too)."""
    headers = dict(re.findall(r"^#(\d+) \[[^\]]+\] (\S+)", log, flags=re.M))
    return sum(1 for step in re.findall(r"^#(\d+) CACHED$", log, flags=re.M) if headers.get(step) != "FROM")


def pin_step_cached(log: str) -> bool:
    """The step that installs the extra pin came from the cache: a rebuild that measured nothing
    (an earlier run built the same pin on the same layers; pick other --pins)."""
    headers = dict(re.findall(r"^#(\d+) \[[^\]]+\] (.*)$", log, flags=re.M))
    pin_steps = {n for n, h in headers.items() if "pip-packages" in h or "six==" in h}
    return any(n in pin_steps for n in re.findall(r"^#(\d+) CACHED$", log, flags=re.M))


def trains(report: dict) -> bool:
    """The image really trained: there are train.* checks and every one passed (the suite's other
    checks, such as the environment's, count apart: the table's "suite failed" note)."""
    checks = report.get("checks") or []
    train = [c for c in checks if c["name"].startswith("train.")]
    return bool(train) and all(c["status"] == "pass" for c in train)


def pair_spread(pairs: list[dict]) -> list[float] | None:
    """The middle half of the per-pair ratios (first and third quartile)."""
    ratios = [p["container_ms"] / p["host_ms"] for p in pairs if p.get("container_ms") and p.get("host_ms")]
    if len(ratios) < 4:
        return None
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return [round(q1, 3), round(q3, 3)]


def overhead_figures(pairs: list[dict]) -> dict:
    """Medians of each side and the median of the per-pair ratios container / host."""
    ok = [p for p in pairs if p.get("container_ms") and p.get("host_ms")]
    if not ok:
        return {"container_ms": None, "host_ms": None, "ratio": None}
    return {"container_ms": round(statistics.median(p["container_ms"] for p in ok), 2),
            "host_ms": round(statistics.median(p["host_ms"] for p in ok), 2),
            "ratio": round(statistics.median(p["container_ms"] / p["host_ms"] for p in ok), 3)}


def step_ms(report: dict) -> float | None:
    """Median over ranks and launchers (mpi, gloo) of the smoke training's step time."""
    values = [r["data"]["step_ms"] for c in report.get("checks") or [] if c["name"].startswith("perf.step.")
              for r in (c.get("ranks") or {}).values() if (r.get("data") or {}).get("step_ms")]
    return round(statistics.median(values), 3) if values else None


# ---- summarising ----------------------------------------------------------------------------

def summarize(results: dict) -> list[dict]:
    """One row per stack and builder, from the raw results."""
    rows = []
    for stack, per in results.get("stacks", {}).items():
        host_steps = [r["step_ms"] for r in per.get("host", []) if r.get("step_ms")]
        host_step = statistics.median(host_steps) if host_steps else None
        names = [b for b in BUILDERS if b in per.get("builders", {})]
        for builder in names + sorted(set(per.get("builders", {})) - set(BUILDERS)):
            raw = per.get("builders", {}).get(builder)
            if not raw:
                continue
            payload = raw["payload"]["total"]
            verifies = raw.get("verify") or []
            walls = [v["wall_s"] for v in verifies]
            steps = [v["step_ms"] for v in verifies if v.get("step_ms")]
            step = statistics.median(steps) if steps else None
            own_host = [h["step_ms"] for h in raw.get("host") or [] if h.get("step_ms")]
            host = statistics.median(own_host) if own_host else host_step   # its interleaved host runs
            cold = raw.get("cold_s")
            ratio, spread = None, None
            if (raw.get("overhead") or {}).get("ratio"):           # paired runs (ABBA): preferred
                step, host = raw["overhead"]["container_ms"], raw["overhead"]["host_ms"]
                ratio = raw["overhead"]["ratio"]
                spread = pair_spread(raw["overhead"]["pairs"])
            elif step and host:
                ratio = step / host
            row = {
                "stack": stack, "builder": builder,
                "size_mb": round(raw["size_bytes"] / 1e6),
                "payload_mb": round(payload / 1e6),
                "ratio": round(raw["size_bytes"] / payload, 3),
                "cold_s": cold,
                "rebuild_s": raw.get("rebuild_s"),
                "rebuild_share": round(raw["rebuild_s"] / cold, 3) if cold and raw.get("rebuild_s") is not None else None,
                "tool_s": raw.get("rebuild_tool_s"),
                "verify_s": round(statistics.median(walls), 1) if walls else None,
                "verify_ok": bool(verifies) and all(v["ok"] for v in verifies),
                "trains": bool(verifies) and all(v["trains"] for v in verifies),
                "suite_failed": max(((v.get("summary") or {}).get("fail") or 0 for v in verifies), default=0),
                "step_ms": round(step, 1) if step else None,
                "host_step_ms": round(host, 1) if host else None,
                "overhead": round(ratio, 3) if ratio else None,
                "overhead_spread": spread,
            }
            rows.append(row)
    for stack in {r["stack"] for r in rows}:
        mine = [r for r in rows if r["stack"] == stack]
        working = [r for r in mine if r["trains"]] or mine   # an image that cannot train does not count
        smallest = min(r["size_mb"] for r in working)
        for r in mine:
            r["smallest"] = r["size_mb"] == smallest and r in working
    return rows


def _fmt(value, fmt="{}", none="-"):
    return none if value is None else fmt.format(value)


def format_table(results: dict) -> str:
    rows = summarize(results)
    lines = [
        "| stack | builder | image MB | payload MB | ratio | cold s | rebuild s | rebuild/cold | "
        "verify s | trains | step ms (container / host) | overhead |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        lines.append("| {stack} | {builder} | {size} | {payload} | {ratio} | {cold} | {rebuild} | {share} | "
                     "{verify} | {trains} | {step} | {overhead} |".format(
                         stack=r["stack"], builder=r["builder"],
                         size=f"**{r['size_mb']}**" if r["smallest"] else r["size_mb"],
                         payload=r["payload_mb"], ratio=f"{r['ratio']:.3f}",
                         cold=_fmt(r["cold_s"], "{:.0f}"), rebuild=_fmt(r["rebuild_s"], "{:.0f}"),
                         share=_fmt(r["rebuild_share"], "{:.1%}"), verify=_fmt(r["verify_s"], "{:.1f}"),
                         trains=("NO" if not r["trains"] else
                                 f"yes; suite: {r['suite_failed']} failed" if r.get("suite_failed") else "yes"),
                         step=f"{_fmt(r['step_ms'], '{:.1f}')} / {_fmt(r['host_step_ms'], '{:.1f}')}",
                         overhead=_fmt(r["overhead"], "{:.3f}")))
    render = results.get("render") or {}
    if render:
        lines += ["", "| preset | `build --no-build` median s | max s | runs |", "|---|---:|---:|---:|"]
        for name, r in sorted(render.items()):
            lines.append(f"| {name} | {r['median_s']:.2f} | {r['max_s']:.2f} | {r['runs']} |")
    return "\n".join(lines)


def goals(results: dict) -> list[str]:
    """envbuilder's goals, each 'ok' or 'MISSED', for the closing lines."""
    out = []
    for r in summarize(results):
        if r["builder"] != "envbuilder":
            continue
        s = r["stack"]
        out.append(f"{s}: ratio {r['ratio']:.3f} <= {GOALS['ratio']} and smallest: "
                   + ("ok" if r["ratio"] <= GOALS["ratio"] and r["smallest"] and r["trains"] else "MISSED"))
        if r["rebuild_share"] is not None:
            out.append(f"{s}: rebuild {r['rebuild_share']:.1%} of cold <= {GOALS['rebuild_share']:.0%}: "
                       + ("ok" if r["rebuild_share"] <= GOALS["rebuild_share"] else "MISSED"))
        if r["verify_s"] is not None:
            out.append(f"{s}: verify {r['verify_s']:.1f} s <= {GOALS['verify_s']:.0f} s: "
                       + ("ok" if r["verify_s"] <= GOALS["verify_s"] else "MISSED"))
        if r["overhead"] is not None:
            line = f"{s}: container overhead {r['overhead']:.3f} <= {GOALS['overhead']}: "
            q1, q3 = r.get("overhead_spread") or (r["overhead"], r["overhead"])
            if q3 - q1 > NOISE:
                out.append(line + f"too noisy to tell (pair ratios, middle half: {q1:.2f}-{q3:.2f})")
            else:
                out.append(line + ("ok" if r["overhead"] <= GOALS["overhead"] else "MISSED"))
    for name, r in sorted((results.get("render") or {}).items()):
        if r["median_s"] > GOALS["render_s"]:
            out.append(f"render {name}: {r['median_s']:.2f} s > {GOALS['render_s']} s: MISSED")
    if results.get("render"):
        worst = max(r["median_s"] for r in results["render"].values())
        out.append(f"render: slowest preset {worst:.2f} s <= {GOALS['render_s']} s: "
                   + ("ok" if worst <= GOALS["render_s"] else "MISSED"))
    return out


def fake_results() -> dict:
    """Made-up measurements in the shape a real run writes (for --dry-run and the tests)."""
    def builder(size, payload, cold, rebuild, step):
        verify = [{"wall_s": w, "ok": True, "summary": {}, "trains": True, "step_ms": step, "load": [0.5, 0.6]}
                  for w in (40.0, 41.0, 39.0)]
        return {"size_bytes": size, "payload": {"total": payload}, "cold_s": cold, "rebuild_s": rebuild,
                "rebuild_tool_s": 8.0, "verify": verify}
    host = [{"step_ms": 50.0, "wall_s": 30.0, "ok": True}]
    return {"machine": {"cpus": 2}, "stacks": {"torch": {"host": host, "builders": {
        "envbuilder": builder(1_150_000_000, 1_100_000_000, 600.0, 60.0, 51.0),
        "hpccm": builder(1_300_000_000, 1_150_000_000, 650.0, 90.0, 51.5),
        "plain": builder(1_600_000_000, 1_150_000_000, 620.0, 30.0, 52.0)}}},
        "render": {"cpu-torch-horovod.yaml": {"median_s": 0.6, "max_s": 0.7, "runs": 5}}}


# ---- command line ---------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--stacks", default="torch,tf")
    p.add_argument("--builders", default=",".join(BUILDERS))
    p.add_argument("--cold", dest="cold", action="store_true", default=True,
                   help="first build with --no-cache (default)")
    p.add_argument("--no-cold", dest="cold", action="store_false",
                   help="first build from the cache (fast; no cold figure)")
    p.add_argument("--pins", type=lambda v: tuple(v.split(",")), default=PINS, metavar="BEFORE,AFTER",
                   help="the extra pip pin before and after the rebuild (default %s,%s); pick a pair no "
                        "earlier run built, or the rebuild comes from the cache and is not counted" % PINS)
    p.add_argument("--repeat", type=int, default=3, help="verify/host runs per image (median)")
    p.add_argument("--overhead-pairs", type=int, default=8,
                   help="container/host pairs for the overhead figure (median of pair ratios)")
    p.add_argument("--overhead-only", action="store_true",
                   help="build each image from the cache (after an earlier run) and measure only the "
                        "container overhead, merged into --out")
    p.add_argument("--render-repeat", type=int, default=5)
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--no-render", action="store_true")
    p.add_argument("--ca-bundle", default=os.environ.get("ENVBUILDER_CA_BUNDLE",
                                                         "/etc/ssl/certs/ca-certificates.crt"))
    p.add_argument("--wheelhouse", default=os.environ.get("ENVBUILDER_WHEELHOUSE", "/opt/wheels"))
    p.add_argument("--hpccm", default=shutil.which("hpccm") or "hpccm", help="the hpccm command")
    p.add_argument("--host-python", default=HOST_PYTHON,
                   help="interpreter with torch/TF + Horovod for the host step time")
    p.add_argument("--workdir", help="build contexts and logs (default: a temporary folder)")
    p.add_argument("--keep-images", action="store_true")
    p.add_argument("--out", default=str(BENCH / "results.json"), help="results JSON (merged per stack)")
    p.add_argument("--table", metavar="JSON", help="print the table of saved results and stop")
    p.add_argument("--dry-run", action="store_true", help="the table from fake measurements; builds nothing")
    args = p.parse_args(argv)

    if args.table or args.dry_run:
        results = fake_results() if args.dry_run else json.loads(Path(args.table).read_text())
        print(format_table(results))
        print("\n".join(goals(results)))
        return 0

    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    results.setdefault("stacks", {})
    bench = Bench(args)
    results["machine"] = machine()
    results["machine"]["load_at_start"] = list(os.getloadavg())

    def save():
        results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        out.write_text(json.dumps(results, indent=1) + "\n")

    if args.overhead_only:
        for stack in args.stacks.split(","):
            for builder in args.builders.split(","):
                raw = results["stacks"].get(stack, {}).get("builders", {}).get(builder)
                if raw is None:
                    sys.exit(f"bench: no results for {stack}/{builder} in {out}: run the full benchmark first")
                raw["overhead"] = bench.overhead_of_cached(stack, builder)
                save()
    elif not args.no_render:
        results["render"] = bench.render()
        save()
    if not args.render_only and not args.overhead_only:
        for stack in args.stacks.split(","):
            per = results["stacks"].setdefault(stack, {})
            per.setdefault("builders", {})
            for builder in args.builders.split(","):
                per["builders"][builder] = bench.builder(stack, builder)
                save()
            per["host"] = [h for b in per["builders"].values() for h in b.get("host", [])] or bench.host(stack)
            save()
    print(format_table(results))
    print("\n".join(goals(results)))
    print(f"\nresults: {out}; logs and contexts: {bench.work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
