"""TF_CONFIG for `distributed: tf-multiworker`: job.sbatch sets it in every task of the srun step,
so an unchanged script that builds tf.distribute.MultiWorkerMirroredStrategy() with its default
resolver (which reads TF_CONFIG, as TensorFlow's tutorials do) finds the whole job.

TensorFlow's format (catalog source tf_config_docs: tensorflow.org/tutorials/distribute/
multi_worker_with_keras, "Multi-worker configuration", and the TFConfigClusterResolver API page,
tensorflow.org/api_docs/python/tf/distribute/cluster_resolver/TFConfigClusterResolver): a JSON object with "cluster" (here one job, "worker": ["host:port", ...], one
entry per worker) and "task" ({"type": "worker", "index": i}: this process's entry in that list).
All workers get the same cluster; only the index differs.

Here, inside the step (SLURM_STEP_* describe the step, not the allocation):
  workers    the step's nodes in Slurm's order (SLURM_STEP_NODELIST, hostlist notation such as
             "n[01-03,7],gpu5", expanded in bash: the image has no scontrol), each repeated by its
             task count (SLURM_STEP_TASKS_PER_NODE, e.g. "2(x3),1"): srun's block distribution
  port       MASTER_PORT (20000 + job id % 20000, the job's torch.distributed port) + the task's
             local id on its node: 20000-39999 plus tasks per node, one port per task of a node,
             different between jobs that share a node. Neither the spec nor a site profile has a
             port key; SlurmClusterResolver (the smoke suite's) uses the same base and offsets
  index      SLURM_PROCID; each task checks that the block order puts it where Slurm did
             (SLURMD_NODENAME, SLURM_LOCALID) and stops with a message otherwise (-m cyclic,
             an arbitrary hostfile)
Node names are checked against [A-Za-z0-9._-] before they go into the JSON; nothing is
evaluated by the shell. A TF_CONFIG already in the job's environment (exported before sbatch, or
cluster.env) is kept, and the job's log says so, unless distributed.tf_config is `replace`.
"""

from __future__ import annotations

from ...plan.job import JobPlan
from ...smoke.tf_coordination import DEFAULT_S as HEARTBEAT_DEFAULT_S, ENV as HEARTBEAT_ENV


def function_lines(plan: JobPlan) -> list[str]:
    """Bash functions (exported into the step): hostlist and tasks-per-node parsers, tf_config."""
    if plan.tf_config is None:
        return []
    return [
        "",
        "# TensorFlow multi-worker (distributed: tf-multiworker): TF_CONFIG for every task, from the",
        "# step's nodes and tasks per node (TensorFlow's format: tensorflow.org/tutorials/distribute/",
        '# multi_worker_with_keras, "Multi-worker configuration"). Pure bash: the image has no scontrol.',
        "# tf_hosts LIST: Slurm's hostlist notation (n[01-03,7],gpu5) -> the array tf_nodes, in order",
        "tf_hosts() {",
        "    local list=$1 cur='' ch depth=0 i item",
        "    tf_nodes=()",
        "    for (( i = 0; i < ${#list}; i++ )); do",
        "        ch=${list:i:1}",
        "        case $ch in",
        "            '[') depth=$(( depth + 1 )); cur+=$ch ;;",
        "            ']') depth=$(( depth - 1 )); cur+=$ch ;;",
        "            ,) if [ \"$depth\" = 0 ]; then tf_host \"$cur\" || return; cur=''; else cur+=$ch; fi ;;",
        "            *) cur+=$ch ;;",
        "        esac",
        "    done",
        '    tf_host "$cur"',
        "}",
        "# tf_host NAME: one name with [ranges] groups (rack[1-2]-n[1,3]) appended to tf_nodes",
        "tf_host() {",
        "    local item=$1 pre inner rest part lo hi n num parts",
        "    [ -n \"$item\" ] || return 0",
        "    if [[ $item != *'['* ]]; then",
        "        [[ $item =~ ^[A-Za-z0-9._-]+$ ]] || { note \"cannot read node name '$item'\"; return 1; }",
        '        tf_nodes+=("$item")',
        "        return 0",
        "    fi",
        "    [[ $item == *'['*']'* ]] || { note \"cannot read node name '$item'\"; return 1; }",
        "    pre=${item%%'['*} rest=${item#*'['}",
        "    inner=${rest%%']'*} rest=${rest#*']'}",
        '    IFS=, read -ra parts <<< "$inner"',
        '    for part in "${parts[@]}"; do',
        "        lo=${part%%-*} hi=${part#*-}",
        "        [[ $lo =~ ^[0-9]+$ && $hi =~ ^[0-9]+$ ]] || { note \"cannot read node range '$part' in '$item'\"; return 1; }",
        "        for (( n = 10#$lo; n <= 10#$hi; n++ )); do",
        "            printf -v num '%0*d' \"${#lo}\" \"$n\"",
        '            tf_host "$pre$num$rest" || return',
        "        done",
        "    done",
        "}",
        "# tf_counts TEXT: Slurm's tasks per node (2(x3),1) -> the array tf_per_node",
        "tf_counts() {",
        "    local part parts i",
        "    tf_per_node=()",
        '    IFS=, read -ra parts <<< "$1"',
        '    for part in "${parts[@]}"; do',
        "        if [[ $part =~ ^([0-9]+)(\\(x([0-9]+)\\))?$ ]]; then",
        "            for (( i = 0; i < 10#${BASH_REMATCH[3]:-1}; i++ )); do tf_per_node+=(\"${BASH_REMATCH[1]}\"); done",
        "        else",
        "            note \"cannot read tasks per node '$1'\"; return 1",
        "        fi",
        "    done",
        "}",
        "# tf_config: prints TF_CONFIG for this task (SLURM_PROCID) of the step",
        "tf_config() {",
        "    local tf_nodes tf_per_node workers='' i l k=0 me='' mine=-1",
        '    local rank=${SLURM_PROCID:-0} base=${MASTER_PORT:-20000}',
        '    [[ $rank =~ ^[0-9]+$ && $base =~ ^[0-9]+$ ]] || { note "SLURM_PROCID \'$rank\' or MASTER_PORT \'$base\' is not a number"; return 1; }',
        '    tf_hosts "${SLURM_STEP_NODELIST:-${SLURM_JOB_NODELIST:-$(hostname)}}" || return',
        '    tf_counts "${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}" || return',
        '    if [ "${#tf_nodes[@]}" != "${#tf_per_node[@]}" ]; then',
        '        note "${#tf_nodes[@]} node(s) but tasks per node for ${#tf_per_node[@]}"; return 1',
        "    fi",
        '    for (( i = 0; i < ${#tf_nodes[@]}; i++ )); do',
        '        for (( l = 0; l < 10#${tf_per_node[i]}; l++ )); do',
        '            workers+="${workers:+, }\\"${tf_nodes[i]}:$(( base + l ))\\""',
        '            if [ "$k" = "$rank" ]; then me=${tf_nodes[i]} mine=$l; fi',
        "            k=$(( k + 1 ))",
        "        done",
        "    done",
        '    [ -n "$me" ] || { note "task $rank is not among the $k task(s) of the step\'s nodes"; return 1; }',
        "    # srun's block distribution puts task k where the list does; anything else is refused",
        '    if [ "$me" != "${SLURMD_NODENAME:-$me}" ] || [ "$mine" != "${SLURM_LOCALID:-$mine}" ]; then',
        '        note "task $rank runs on ${SLURMD_NODENAME:-?} as local task ${SLURM_LOCALID:-?}, but the block order' +
        ' of $k task(s) puts it on ${me:-no node} as local task $mine: TF_CONFIG needs srun\'s block distribution"',
        "        return 1",
        "    fi",
        '    printf \'{"cluster": {"worker": [%s]}, "task": {"type": "worker", "index": %d}}\\n\' "$workers" "$rank"',
        "}",
    ]


def export_names(plan: JobPlan) -> str:
    return " tf_hosts tf_host tf_counts tf_config" if plan.tf_config is not None else ""


def batch_lines(plan: JobPlan) -> list[str]:
    """Once, in the batch script: keep a TF_CONFIG the job was given, or have every task set one."""
    if plan.tf_config is None:
        return []
    replace = plan.tf_config == "replace"
    keep = [
        'if [ -n "${TF_CONFIG:-}" ]; then',
        "    ENVBUILDER_TF_CONFIG=kept",
        '    note "TF_CONFIG was set before the job: kept as it is, not made from Slurm\'s node list'
        ' (distributed.tf_config: replace overrides it)"',
        "else",
        "    ENVBUILDER_TF_CONFIG=slurm",
        "fi",
    ]
    return [
        "",
        "# TensorFlow multi-worker: every task gets TF_CONFIG from Slurm's node list (tf_config, in",
        "# rank_main); ports MASTER_PORT + the task's local id on its node"
        + ("; distributed.tf_config: replace, so a TF_CONFIG given to the job is replaced" if replace else ""),
        *(["ENVBUILDER_TF_CONFIG=slurm"] if replace else keep),
        '[ "$ENVBUILDER_TF_CONFIG" = kept ] || note "TF_CONFIG: set in every task from the step\'s nodes'
        ' and tasks per node (ports from $MASTER_PORT)"',
        "export ENVBUILDER_TF_CONFIG",
        "# TensorFlow's coordination service ends the job when a worker misses heartbeats for 10 s, its",
        "# default: on a loaded node that is a false failure. The image's start-up hook",
        "# (envbuilder_smoke/tf_coordination.py) gives a strategy built without a timeout this one;",
        f"# export {HEARTBEAT_ENV}=N before sbatch to change it, 0 for TensorFlow's own",
        f"export {HEARTBEAT_ENV}=${{{HEARTBEAT_ENV}:-{HEARTBEAT_DEFAULT_S}}}",
    ]


def rank_lines(plan: JobPlan) -> list[str]:
    """Inside each task (rank_main): TF_CONFIG for this task."""
    if plan.tf_config is None:
        return []
    return [
        '    if [ "${ENVBUILDER_TF_CONFIG:-}" = slurm ]; then',
        '        TF_CONFIG=$(tf_config) || die "cannot make TF_CONFIG for task ${SLURM_PROCID:-0} (above)"',
        "        export TF_CONFIG",
        "    fi",
    ]
