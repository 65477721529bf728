"""TF_CONFIG for `distributed: tf-multiworker` (envbuilder/render/sbatch_sections/tfconfig.py): job.sbatch sets it in
every task from the step's node list and tasks per node, so an unchanged script that builds
tf.distribute.MultiWorkerMirroredStrategy() with the default resolver trains across nodes.

Fast: the rendered bash functions run on Slurm's notations (compared with `scontrol show hostnames`
where there is one), the JSON is TensorFlow's shape, hostile node names are refused unevaluated, a
TF_CONFIG given to the job is kept (or replaced when the spec says so), shellcheck is clean for
every runtime. On the 2-node cluster of tools/minicluster (host runtime, the smoke environment's
TensorFlow): a script written for the test, using nothing but the default resolver, sees the
whole job and ends with the same weights on every rank."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import RECIPES
from test_slurm_render import RUNTIMES, render, shellcheck

RECIPE = RECIPES / "cpu-tf-multiworker.yaml"


@pytest.fixture(scope="module")
def functions(tmp_path_factory) -> str:
    """The TF_CONFIG functions of the rendered job.sbatch, with the script's note()."""
    from envbuilder.cli import main

    out = tmp_path_factory.mktemp("tfc") / "job"
    assert main(["build", str(RECIPE), "--no-build", "--out", str(out)]) == 0
    text = (out / "job.sbatch").read_text()
    body = re.search(r"^tf_hosts\(\) \{\n.*?^tf_config\(\) \{\n.*?^\}\n", text, re.S | re.M)
    assert body, "no tf_config functions in job.sbatch"
    return 'note() { echo "envbuilder: $*" >&2; }\n' + body.group(0)


def tf_config(functions: str, env: dict) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_"))}
    proc = subprocess.run(["bash", "-c", functions + "\ntf_config"], capture_output=True, text=True,
                          env={**clean, **env}, timeout=30)
    return proc.returncode, proc.stdout, proc.stderr


def hosts(functions: str, nodelist: str) -> list[str]:
    proc = subprocess.run(["bash", "-c", functions + '\ntf_hosts "$1" && printf "%s\\n" "${tf_nodes[@]}"',
                           "x", nodelist], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.parametrize("nodelist, expanded", [
    ("n[1-2]", ["n1", "n2"]),
    ("a1,b[3-4]", ["a1", "b3", "b4"]),
    ("node[01-03,7]", ["node01", "node02", "node03", "node7"]),
    ("x[08-11],y", ["x08", "x09", "x10", "x11", "y"]),
    ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
    ("mc-n[1-2]", ["mc-n1", "mc-n2"]),
])
def test_slurm_hostlists_expand_as_scontrol_does(functions, nodelist, expanded):
    assert hosts(functions, nodelist) == expanded
    scontrol = shutil.which("scontrol")
    if scontrol:
        proc = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        if proc.returncode == 0:
            assert proc.stdout.split() == expanded


@pytest.mark.parametrize("nodelist, per_node, rank, node, local", [
    ("n[1-2]", "2(x2)", 3, "n2", 1),
    ("n[1-2]", "3,1", 3, "n2", 0),
    ("a1,b[3-4]", "2(x2),1", 4, "b4", 0),
    ("a1,b[3-4]", "1(x3)", 0, "a1", 0),
])
def test_every_task_gets_the_same_cluster_and_its_own_index(functions, nodelist, per_node, rank, node, local):
    from envbuilder.smoke.gloo_step import parse_tasks_per_node

    counts = parse_tasks_per_node(per_node)           # the suite's Python reading of the notation
    names = hosts(functions, nodelist)
    want = [f"{h}:{21234 + i}" for h, c in zip(names, counts) for i in range(c)]
    seen = []
    for r in range(len(want)):
        h, port = want[r].split(":")
        code, out, err = tf_config(functions, {
            "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_PROCID": str(r),
            "MASTER_PORT": "21234", "SLURMD_NODENAME": h, "SLURM_LOCALID": str(int(port) - 21234)})
        assert code == 0, err
        config = json.loads(out)           # JSON, one line, TensorFlow's shape
        assert out.count("\n") == 1 and set(config) == {"cluster", "task"}
        assert config["task"] == {"type": "worker", "index": r}
        seen.append(config["cluster"])
    assert seen == [{"worker": want}] * len(want)
    assert want[rank] == f"{node}:{21234 + local}"


def test_the_job_nodelist_is_used_outside_a_step_and_a_task_slurm_did_not_place_there_is_refused(functions):
    code, out, _ = tf_config(functions, {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)",
                                         "SLURM_PROCID": "1", "MASTER_PORT": "20000"})
    assert code == 0 and json.loads(out)["cluster"]["worker"] == ["n1:20000", "n2:20000"]
    # srun -m cyclic: task 1 runs on n2, block order puts it on n1
    code, out, err = tf_config(functions, {"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
                                           "SLURM_PROCID": "1", "SLURMD_NODENAME": "n2", "SLURM_LOCALID": "0"})
    assert code == 1 and out == ""
    assert "task 1 runs on n2 as local task 0, but the block order of 4 task(s) puts it on n1" in err
    code, _, err = tf_config(functions, {"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2",
                                         "SLURM_PROCID": "0"})
    assert code == 1 and "2 node(s) but tasks per node for 1" in err
    code, _, err = tf_config(functions, {"SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2",
                                         "SLURM_PROCID": "5"})
    assert code == 1 and "task 5 is not among the 2 task(s)" in err


@pytest.mark.parametrize("nodelist", ['n1,"x', "a$(touch {mark})", "a[1-$(touch {mark})]", "n`touch {mark}`",
                                      "n[1-2", "a b"])
def test_node_names_that_are_not_names_are_refused_and_never_evaluated(functions, nodelist, tmp_path):
    mark = tmp_path / "evaluated"
    code, out, err = tf_config(functions, {"SLURM_STEP_NODELIST": nodelist.format(mark=mark),
                                           "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_PROCID": "0"})
    assert code == 1 and out == "" and "cannot read node" in err, (out, err)
    assert not mark.exists()


def job_text(cli, tmp_path: Path, tf_config_mode: str | None = None, runtime: str = "host") -> str:
    data = yaml.safe_load(RECIPE.read_text())
    if tf_config_mode:
        data["distributed"]["tf_config"] = tf_config_mode
    spec = tmp_path / f"tf-{tf_config_mode}.yaml"
    spec.write_text(yaml.safe_dump(data))
    return render(tmp_path, spec, "--runtime", runtime)


def batch_part(text: str) -> str:
    m = re.search(r"^# TensorFlow multi-worker: every task.*?^export ENVBUILDER_TF_CONFIG\n", text, re.S | re.M)
    assert m, text
    return m.group(0)


def rank_part(text: str) -> str:
    m = re.search(r'^    if \[ "\$\{ENVBUILDER_TF_CONFIG:-\}" = slurm \]; then\n.*?^    fi\n', text, re.S | re.M)
    assert m, text
    return m.group(0)


def run_parts(functions: str, text: str, env: dict) -> subprocess.CompletedProcess:
    script = (functions + 'die() { echo "envbuilder: error: $*" >&2; exit 2; }\nMASTER_PORT=20042\n'
              + batch_part(text) + "rank() {\n" + rank_part(text) + '    printf "%s" "$TF_CONFIG"\n}\nrank\n')
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TF_CONFIG"))}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**clean, **env}, timeout=30)


def test_a_tf_config_given_to_the_job_is_kept_and_the_log_says_so(cli, functions, tmp_path):
    step = {"SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_PROCID": "0"}
    text = job_text(cli, tmp_path)
    mine = '{"cluster": {"worker": ["login:1"]}, "task": {"type": "worker", "index": 0}}'
    kept = run_parts(functions, text, {**step, "TF_CONFIG": mine})
    assert kept.returncode == 0 and kept.stdout == mine, kept.stderr
    assert "TF_CONFIG was set before the job: kept as it is" in kept.stderr
    made = run_parts(functions, text, step)
    assert made.returncode == 0 and json.loads(made.stdout)["cluster"]["worker"] == ["n1:20042"]
    assert "TF_CONFIG: set in every task from the step's nodes" in made.stderr
    # distributed.tf_config: replace: Slurm's, whatever the job was given
    replaced = run_parts(functions, job_text(cli, tmp_path, "replace"), {**step, "TF_CONFIG": mine})
    assert replaced.returncode == 0 and json.loads(replaced.stdout)["cluster"]["worker"] == ["n1:20042"]
    assert "kept" not in replaced.stderr


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_tf_job_script_passes_shellcheck(cli, tmp_path, runtime):
    text = job_text(cli, tmp_path, "replace" if runtime == "host" else None, runtime)
    assert "export -f note die rank_main node_setup tf_hosts tf_host tf_counts tf_config" in text
    assert shellcheck(text, tmp_path) == ""


def test_other_kinds_get_no_tf_config_and_refuse_the_option(cli, write_spec, tmp_path):
    assert "TF_CONFIG" not in render(tmp_path, RECIPES / "cpu-torch-ddp.yaml")
    data = yaml.safe_load((RECIPES / "cpu-torch-ddp.yaml").read_text())
    data["distributed"]["tf_config"] = "replace"
    r = cli("build", str(write_spec(yaml.safe_dump(data))), "--no-build", "--out", str(tmp_path / "x"))
    assert r.code != 0 and "DIST_OPTION" in r.out + r.err and "tf_config is an option of kind tf-multiworker" \
        in r.out + r.err


# --------------------------------------------------------------------------- 2 nodes, for real

USER_SCRIPT = '''\
"""A user's MultiWorkerMirroredStrategy script, as TensorFlow's tutorial writes it: TF_CONFIG read
by the default resolver, nothing of envbuilder's."""
import hashlib, json, os, socket, sys
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
resolver = strategy.cluster_resolver
workers = resolver.cluster_spec().as_dict()["worker"]
index = resolver.task_id
procid = int(os.environ["SLURM_PROCID"])
assert resolver.task_type == "worker", resolver.task_type
assert index == procid, (index, procid)
assert len(workers) == int(os.environ["SLURM_NTASKS"]) == strategy.num_replicas_in_sync, workers
assert workers[index].split(":")[0] == os.environ["SLURMD_NODENAME"], (workers, index)

tf.keras.utils.set_random_seed(7)
x = np.random.RandomState(0).normal(size=(256, 8)).astype("float32")
y = np.tanh(x @ np.arange(8, dtype="float32").reshape(8, 1) / 8)
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4, activation="tanh"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
history = model.fit(data, epochs=1, steps_per_epoch=3, verbose=0)
digest = hashlib.sha256(b"".join(w.astype("float32").tobytes() for w in model.get_weights())).hexdigest()
out = os.path.join(sys.argv[1], "tf-rank-%d.json" % procid)
with open(out, "w") as fh:
    json.dump({"procid": procid, "index": index, "workers": workers, "host": os.environ["SLURMD_NODENAME"],
               "hostname": socket.gethostname(), "weights": digest, "loss": history.history["loss"][-1],
               "tf_config": os.environ["TF_CONFIG"]}, fh)
'''


def test_an_unchanged_multiworker_script_trains_across_two_nodes(tmp_path):
    from test_multinode import NODES, ROOT, build_folder, host_python, sbatch_wait
    from infra import require_minicluster

    cluster = require_minicluster()
    cluster["USER"] = os.environ.get("USER") or "root"
    shared = ROOT / "shared" / "tests" / f"tfconfig-{os.getpid()}-{tmp_path.name[-12:]}"
    shared.mkdir(parents=True)
    try:
        python = host_python()
        folder = build_folder(RECIPE, shared / "job", "--runtime", "host")
        script = shared / "train.py"
        script.write_text(USER_SCRIPT)
        results = shared / "results"
        results.mkdir()
        code, job_id, log = sbatch_wait(cluster, folder / "job.sbatch", "--nodes=2", python, str(script),
                                        str(results), timeout=600)
        assert code == 0, log[-4000:]
        assert "envbuilder: TF_CONFIG: set in every task from the step's nodes" in log
        ranks = [json.loads((results / f"tf-rank-{i}.json").read_text()) for i in range(4)]
        workers = ranks[0]["workers"]
        port = 20000 + int(job_id) % 20000
        assert workers == [f"{n}:{port + i}" for n in NODES for i in range(2)], workers
        for i, r in enumerate(ranks):
            assert r["procid"] == r["index"] == i and r["workers"] == workers
            assert workers[i].split(":")[0] == r["host"]
            assert json.loads(r["tf_config"])["task"] == {"type": "worker", "index": i}
        assert {r["host"] for r in ranks} == set(NODES)
        assert len({r["weights"] for r in ranks}) == 1, ranks          # the same weights everywhere

        # a TF_CONFIG the user exported before sbatch is what every task gets, and the log says so
        mine = '{"cluster": {"worker": ["elsewhere:1"]}, "task": {"type": "worker", "index": 0}}'
        code, job_id, log = sbatch_wait({**cluster, "TF_CONFIG": mine}, folder / "job.sbatch", "--nodes=2",
                                        python, "-c", "import os, sys; open(sys.argv[1] + '/kept-%s' % "
                                        "os.environ['SLURM_PROCID'], 'w').write(os.environ['TF_CONFIG'])",
                                        str(results))
        assert code == 0, log[-4000:]
        assert "TF_CONFIG was set before the job: kept as it is" in log
        assert [(results / f"kept-{i}").read_text() for i in range(4)] == [mine] * 4
        print(f"tf-multiworker, unchanged script 2x2: loss {ranks[0]['loss']:.4f}, "
              f"weights {ranks[0]['weights'][:12]} on all 4 ranks")
    finally:
        shutil.rmtree(shared, ignore_errors=True)
