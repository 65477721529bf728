"""The benchmark script's own code: its table, goals and JSON from measurements (no builds, no
timing), and the payload measurement on a real virtual environment."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import venv
from pathlib import Path

from conftest import ROOT

BENCH = ROOT / "bench" / "bench.py"


def _bench():
    spec = importlib.util.spec_from_file_location("envbuilder_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_prints_the_table_and_the_goals():
    proc = subprocess.run([sys.executable, str(BENCH), "--dry-run"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("| stack | builder | image MB | payload MB | ratio |")
    assert any(l.startswith("| torch | envbuilder | **1150** | 1100 | 1.045 | 600 | 60 | 10.0% |") for l in lines)
    assert "torch: ratio 1.045 <= 1.15 and smallest: ok" in lines
    assert "torch: rebuild 10.0% of cold <= 15%: ok" in lines
    assert "render: slowest preset 0.60 s <= 1.0 s: ok" in lines


def test_summary_marks_the_smallest_and_a_missed_goal(tmp_path):
    bench = _bench()
    results = bench.fake_results()
    env = results["stacks"]["torch"]["builders"]["envbuilder"]
    env["size_bytes"] = 1_700_000_000            # now the largest, ratio 1.545
    env["rebuild_s"] = 300.0                     # half of the cold build
    env["verify"][0]["trains"] = False           # one verify run did not train
    results["stacks"]["torch"]["builders"]["hpccm"]["verify"][0]["summary"] = {"pass": 29, "fail": 3, "skip": 1}
    rows = {r["builder"]: r for r in bench.summarize(results)}
    assert rows["hpccm"]["smallest"] and not rows["envbuilder"]["smallest"]
    assert rows["envbuilder"]["ratio"] == 1.545 and rows["envbuilder"]["rebuild_share"] == 0.5
    assert rows["envbuilder"]["trains"] is False
    assert rows["envbuilder"]["overhead"] == 1.02          # median 51.0 ms / host 50.0 ms
    goals = bench.goals(results)
    assert "torch: ratio 1.545 <= 1.15 and smallest: MISSED" in goals
    assert "torch: rebuild 50.0% of cold <= 15%: MISSED" in goals
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps(results))
    proc = subprocess.run([sys.executable, str(BENCH), "--table", str(saved)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "| torch | envbuilder | 1700 |" in proc.stdout and "| NO |" in proc.stdout
    assert "| yes; suite: 3 failed |" in proc.stdout


def test_step_time_and_training_come_from_the_smoke_report():
    bench = _bench()
    rank = lambda ms: {"status": "pass", "data": {"step_ms": ms}}   # noqa: E731
    report = {"ok": True, "checks": [
        {"name": "train.pytorch[mpi]", "status": "pass"},
        {"name": "perf.step.pytorch[mpi]", "status": "pass", "ranks": {"0": rank(80.0), "1": rank(90.0)}},
        {"name": "train.pytorch[gloo]", "status": "pass"},
        {"name": "perf.step.pytorch[gloo]", "status": "pass", "ranks": {"0": rank(100.0), "1": rank(300.0)}},
    ]}
    assert bench.step_ms(report) == 95.0
    assert bench.trains(report)
    # an environment check failing elsewhere in the suite is not a training failure
    report["checks"].append({"name": "env.cpu_threads", "status": "fail"})
    report["ok"] = False
    assert bench.trains(report)
    report["checks"][2]["status"] = "fail"
    assert not bench.trains(report)
    assert not bench.trains({"ok": True, "checks": [{"name": "versions.python", "status": "pass"}]})


def test_payload_of_a_virtual_environment(tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    (env / "payload-marker.bin").write_bytes(b"x" * 100_000)
    proc = subprocess.run([str(env / "bin" / "python"), str(ROOT / "bench" / "payload.py")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["env_roots"] == [str(env)]
    assert data["bytes"]["venv"] >= 100_000
    assert data["bytes"]["python"] > 1_000_000                  # interpreter + standard library
    assert data["total"] == sum(data["bytes"].values())


def test_a_cold_build_is_one_where_only_the_base_came_from_the_cache():
    bench = _bench()
    log = "\n".join([
        "#4 [devel 1/5] FROM docker.io/local/debian:bookworm-slim", "#4 CACHED",
        "#7 [devel 2/6] RUN apt-get update", "#7 DONE 80.1s",
        "#9 [devel 4/6] RUN pip install torch", "#9 CACHED",
    ])
    assert bench.cached_steps(log) == 1
    assert bench.cached_steps(log.replace("#9 CACHED", "#9 DONE 52.3s")) == 0


def test_a_rebuild_whose_pin_step_came_from_the_cache_is_flagged():
    bench = _bench()
    log = "\n".join([
        "#11 [devel 6/6] RUN --mount=type=bind,source=pins/pip-packages.txt,target=/pins/pip-packages.txt pip",
        "#11 CACHED", "#12 [runtime 3/7] COPY --from=devel /opt/venv /opt/venv", "#12 DONE 5.6s",
    ])
    assert bench.pin_step_cached(log)
    assert not bench.pin_step_cached(log.replace("#11 CACHED", "#11 DONE 1.7s"))


def test_overhead_is_the_median_of_pair_ratios_and_the_table_prefers_it():
    bench = _bench()
    pairs = [{"container_ms": 44.0, "host_ms": 40.0}, {"container_ms": 40.0, "host_ms": 42.0},
             {"container_ms": 41.0, "host_ms": 41.0}, {"container_ms": None, "host_ms": 40.0}]
    fig = bench.overhead_figures(pairs)
    assert fig == {"container_ms": 41.0, "host_ms": 41.0, "ratio": 1.0}      # ratios 1.1, 0.952, 1.0
    assert bench.overhead_figures([]) == {"container_ms": None, "host_ms": None, "ratio": None}
    results = bench.fake_results()
    results["stacks"]["torch"]["builders"]["envbuilder"]["overhead"] = {"pairs": pairs, **fig}
    row = next(r for r in bench.summarize(results) if r["builder"] == "envbuilder")
    assert (row["step_ms"], row["host_step_ms"], row["overhead"]) == (41.0, 41.0, 1.0)
    assert "torch: container overhead 1.000 <= 1.05: ok" in bench.goals(results)


def test_an_overhead_whose_pairs_scatter_is_reported_as_too_noisy_not_ok():
    bench = _bench()
    results = bench.fake_results()
    wide = [{"container_ms": c, "host_ms": 40.0} for c in (18.0, 28.0, 36.0, 40.0, 44.0, 52.0, 60.0, 70.0)]
    results["stacks"]["torch"]["builders"]["envbuilder"]["overhead"] = {"pairs": wide, **bench.overhead_figures(wide)}
    line = next(g for g in bench.goals(results) if "overhead" in g)
    assert "too noisy to tell" in line and "ok" not in line.split(":")[-1], line


def test_gpu_figures_lists_every_step_with_its_seconds_or_cached():
    spec = importlib.util.spec_from_file_location("envbuilder_gpu_figures", ROOT / "bench" / "gpu_figures.py")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    log = "\n".join([
        "#4 [devel 1/8] FROM docker.io/local/debian:bookworm-slim", "#4 CACHED",
        "#12 [devel 7/8] RUN --mount=type=secret,id=ca   export HOROVOD_WITH_MPI=1", "#12 CACHED",
        "#14 [runtime 3/8] COPY --from=devel /opt/venv/lib/python3.11/site-packages/nvidia /opt/venv/x",
        "#14 sha256:871317f9d343", "#14 CACHED",
        "#16 [runtime 4/8] COPY --from=devel-rest /opt/venv /opt/venv", "#16 DONE 9.0s",
        "#19 exporting to image", "#19 DONE 17.6s",
    ])
    log = log.replace("#19 exporting", "#13 [devel-rest 1/1] RUN rm -rf /opt/venv/x\n#13 DONE 0.3s\n#19 exporting")
    rows = module.steps(log, ["devel", "devel-rest", "runtime"])
    assert rows == [("[devel 7/8] RUN --mount=type=secret,id=ca export HOROVOD_WITH_MPI=1", "cached"),
                    ("[devel-rest 1/1] RUN rm -rf /opt/venv/x", "0.3s"),
                    ("[runtime 3/8] COPY --from=devel /opt/venv/lib/python3.11/site-packages/nvidia /opt/venv/x",
                     "cached"),
                    ("[runtime 4/8] COPY --from=devel-rest /opt/venv /opt/venv", "9.0s"),
                    ("exporting to image", "17.6s")]


def test_mpi_allreduce_repeat_table_pairs_each_image_row_with_its_host_row(capsys):
    """bench/mpi_allreduce.py --repeat: medians per row and node count, and the image row divided
    by the host row of the same MPI and settings (a row without a host row gets no ratio)."""
    spec = importlib.util.spec_from_file_location("envbuilder_bench_mpi", ROOT / "bench" / "mpi_allreduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    img, host = "Open MPI 5.0.11 (PyPI wheel), smsc ^cma", "Open MPI 5.0.11 (PyPI wheel), host runtime, smsc ^cma"
    rows = [{"mpi": img, "nodes": 1, "busbw_MBps": v} for v in (900.0, 1000.0, 2000.0)]
    rows += [{"mpi": host, "nodes": 1, "busbw_MBps": v} for v in (500.0, 800.0, 810.0)]
    rows += [{"mpi": "Intel MPI 2021.19 (impi-rt) injected", "nodes": 2, "busbw_MBps": 100.0},
             {"mpi": img, "nodes": 2, "error": "job 7 exited 1"}]
    module.print_medians(rows)
    table = {line.split(" | ")[0].lstrip("| "): line for line in capsys.readouterr().out.splitlines()
             if line.startswith("| ") and "MB/s" in line}
    assert table[img].endswith("| 3 | 1000 MB/s | 900 - 2000 | 1.25 |"), table[img]
    assert table[host].endswith("| 800 MB/s | 500 - 810 |  |"), table[host]
    assert table["Intel MPI 2021.19 (impi-rt) injected"].endswith("|  |")


def test_suite_cpu_tells_a_module_that_computes_from_one_that_waits(tmp_path):
    """bench/suite_cpu.py on two small modules of its own: one computes for 2 CPU seconds, one sleeps
    2 s; the busy one's own CPU seconds are about 2 more than the idle one's (the column other load on
    the machine cannot move: the whole-machine share can, as under CI's second test worker), the table
    has a row per module and a total, and a failing module makes the exit code 1."""
    busy = tmp_path / "test_busy.py"
    busy.write_text("import time\n\ndef test_spin():\n    end = time.process_time() + 2\n"
                    "    while time.process_time() < end:\n        pass\n")
    idle = tmp_path / "test_idle.py"
    idle.write_text("import time\n\ndef test_sleep():\n    time.sleep(2)\n")
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "suite_cpu.py"), str(busy), str(idle), "--", "-p",
                        "no:cacheprovider"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in p.stdout.splitlines() if line.startswith("| ") and "%" in line}
    assert set(rows) == {str(busy), str(idle), "all"}, p.stdout
    share = {k: int(v[1].rstrip("%")) for k, v in rows.items()}
    assert all(0 <= s <= 100 for s in share.values()), p.stdout
    own = {k: float(v[3]) for k, v in rows.items()}
    assert own[str(busy)] - own[str(idle)] >= 1.5, p.stdout
    assert abs(own["all"] - own[str(busy)] - own[str(idle)]) <= 0.2, p.stdout
    assert rows[str(busy)][4].startswith("1 passed"), p.stdout
    failing = tmp_path / "test_fails.py"
    failing.write_text("def test_no():\n    assert False\n")
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "suite_cpu.py"), str(failing)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1 and "1 failed" in p.stdout, p.stdout


def test_horovod_build_type_table_gives_each_build_its_ratio_to_relwithdebinfo():
    spec = importlib.util.spec_from_file_location("hvd_build_type", ROOT / "bench" / "horovod_build_type.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = [{"framework": "pytorch", "version": "2.13.0+cpu", "build": b, "seconds": s, "so_bytes": so,
             "stripped_bytes": 2_265_544} for b, s, so in (("RelWithDebInfo", 200.0, 65_520_280), ("Release", 160.0, 2_267_280),
                                                         ("RelWithDebInfo", 210.0, 65_520_280), ("Release", 170.0, 2_267_280))]
    lines = module.table(rows)
    assert lines[0].startswith("| framework | build | seconds (each run) | mean s | ratio to RelWithDebInfo |")
    assert "| pytorch 2.13.0+cpu | RelWithDebInfo | 200.0, 210.0 | 205 | 1.00 | 65.5 | 2.27 |" in lines
    assert "| pytorch 2.13.0+cpu | Release | 160.0, 170.0 | 165 | 0.80 | 2.3 | 2.27 |" in lines


def test_sif_table_gives_each_way_its_figures_and_envbuilder_over_apptainer():
    spec = importlib.util.spec_from_file_location("bench_sif", ROOT / "bench" / "sif.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    way = {"inodes": 35_339, "compressor": "gzip", "runs": True}
    rows = [{"image": "envbuilder/x:1", "image_bytes": 1_210_000_000,
             "envbuilder": {**way, "seconds": 30.0, "cpu_s": 60.0, "bytes": 358_800_000, "block_size": 262_144,
                            "level": 6},
             "apptainer": {**way, "seconds": 120.0, "cpu_s": 200.0, "bytes": 360_300_000, "block_size": 131_072,
                           "level": 9, "runs": False}}]
    lines = module.table(rows)
    assert lines[0].startswith("| image | image MB | way | seconds | CPU s | SIF MB |")
    assert "| envbuilder/x:1 | 1210 | envbuilder `sif` | 30.0 | 60.0 | 358.8 | 35339 | 256 KiB | 6 | yes |" in lines
    assert "| envbuilder/x:1 | 1210 | `apptainer build` | 120.0 | 200.0 | 360.3 | 35339 | 128 KiB | 9 | NO |" in lines
    assert "| envbuilder/x:1 | | **envbuilder / Apptainer** | **0.25** | **0.30** | **0.996** | | | | |" in lines


def test_sif_bench_reads_the_gzip_level_from_the_squashfs_super_block():
    """No compressor options in the super block means gzip's default, 9 (as Apptainer's SIFs);
    stored options give their level (as envbuilder's tar2sqfs writes them)."""
    import struct

    spec = importlib.util.spec_from_file_location("bench_sif", ROOT / "bench" / "sif.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def super_block(flags: int, options: bytes) -> bytes:
        head = struct.pack("<IIIIIHHH", module.SQUASHFS_MAGIC, 7, 0, 262_144, 0, module.GZIP, 18, flags)
        return (head.ljust(96, b"\0") + options).ljust(106, b"\0")

    assert module.super_block_facts(super_block(0, b"")) == {
        "inodes": 7, "block_size": 262_144, "compressor": "gzip", "level": 9}
    assert module.super_block_facts(super_block(module.COMP_OPTIONS, struct.pack("<HIHH", 0x8008, 6, 15, 0))) == {
        "inodes": 7, "block_size": 262_144, "compressor": "gzip", "level": 6}
    assert module.super_block_facts(bytes(106)) == {}


def test_attest_bench_prints_one_row_per_step():
    spec = importlib.util.spec_from_file_location("bench_attest", ROOT / "bench" / "attest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.table(Path("x.sif"), 358_879_232, [("envbuilder attest sign (cosign bundle)", 0.96),
                                                  ("gate: sha256sum of the SIF", 1.28)], 3)
    lines = text.splitlines()
    assert lines[0] == "SIF x.sif (359 MB), median of 3"
    assert "| envbuilder attest sign (cosign bundle) | 0.96 |" in lines
    assert "| gate: sha256sum of the SIF | 1.28 |" in lines


def test_engine_builds_table_gives_each_engine_cold_warm_and_its_ratio_to_docker():
    spec = importlib.util.spec_from_file_location("engine_builds", ROOT / "bench" / "engine_builds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    r = {"docker": {"cold": {"seconds": 100.0, "size_bytes": 1_100_000_000}, "warm": {"seconds": 5.0, "size_bytes": 1}},
         "apptainer": {"cold": {"seconds": 300.0, "size_bytes": 400_000_000}, "warm": {"seconds": 240.0, "size_bytes": 1}}}
    lines = module.table("cpu-torch-ddp", r).splitlines()
    assert lines[0].split()[:3] == ["cpu-torch-ddp", "cold", "s"]
    assert lines[1].split()[-5:] == ["100", "5", "0.05", "1.00", "1100"]
    assert lines[2].split()[-6:] == ["300", "240", "0.80", "3.00", "400", "(.sif)"]
    assert len(lines) == 3                        # buildah not run: no row
