"""Node vetting in the job (`cluster.vet_min_nodes`, off by default): after the node set-up and
before the training step, one task per node runs the image's own check (envbuilder_smoke.vet: a
known-answer compute check and its rate, an allreduce within the node, the fabric's device and
provider). job.sbatch names every node that failed, that gave no answer, or that computes at less
than half the best node's rate, and goes on without them (`srun --exclude`, fewer nodes, rank 0 on
the first node that passed) while at least `vet_min_nodes` remain; fewer stop the job with exit 2
before any rank starts. `ENVBUILDER_VET_MIN_NODES` at submit time overrides the spec (0: no vetting).
"""

from __future__ import annotations

from ...paths import SMOKE_DIR
from ...plan.job import JobPlan

TAG = "envbuilder-vet"          # what envbuilder_smoke.vet prints first on its line
SLOW_FRACTION = 2               # a node computing at less than 1/2 of the best node's rate is left out


def rank_opts() -> str:
    """What run_ranks/run_nodes add to their srun line (empty without vetting; safe under set -u
    with bash < 4.4)."""
    return ' ${rank_opts[@]+"${rank_opts[@]}"}'


def lines(plan: JobPlan) -> list[str]:
    """After the node set-up step, before any rank: the vetting step and its verdict. In torchrun
    mode the ranks' step has one task per node (torchrun starts the node's ranks)."""
    if not plan.vet_min_nodes:
        return []
    torchrun = plan.torchrun
    python = "python" if plan.runtime.container else 'env PYTHONPATH="$JOB_DIR" python'
    launch = f'{plan.runtime.srun_extra} "${{launch[@]}}" '
    tasks = "1" if torchrun else "per_node"
    return [
        "",
        "# Node vetting (cluster.vet_min_nodes): one task per node runs the image's own check; nodes",
        "# that fail it, give no answer or compute at less than half the best node's rate are named",
        "# and left out (srun --exclude) while at least VET_MIN_NODES remain; fewer stop the job here",
        f'VET_MIN_NODES="${{ENVBUILDER_VET_MIN_NODES:-{plan.vet_min_nodes}}}"',
        "rank_opts=()",
        *(['RANK_NODES="${SLURM_JOB_NUM_NODES:-1}"   # torchrun --nnodes'] if torchrun else []),
        "vet_nodes() {",
        "    local t0=$SECONDS line node verdict mflops mbps reason best=0 best_node='' n",
        "    local -A rate=() why=() answered=()",
        "    local good=() bad=() all=()",
        '    mapfile -t all < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}" 2>/dev/null || hostname)',
        "    local per_node=$(( ${SLURM_NTASKS:-1} / ${SLURM_JOB_NUM_NODES:-1} ))",
        "    while IFS= read -r line; do",
        f'        case $line in "{TAG} "*) ;; *) printf \'%s\\n\' "$line"; continue ;; esac',
        '        read -r _ node verdict mflops mbps reason <<< "$line"',
        '        case $mflops in ""|*[!0-9]*) verdict=bad mflops=0 reason="an answer job.sbatch cannot read: $line" ;; esac',
        '        answered[$node]=1',
        '        rate[$node]=$mflops',
        '        note "vetting: $node: compute $mflops Mflop/s, allreduce within the node ${mbps} MB/s"',
        '        if [ "$verdict" != ok ]; then why[$node]=$reason; fi',
        '        if [ "$verdict" = ok ] && [ "$mflops" -gt "$best" ]; then best=$mflops best_node=$node; fi',
        f"    done < <(timeout 300 srun --overlap --ntasks-per-node=1 --ntasks=\"${{SLURM_JOB_NUM_NODES:-1}}\" "
        f"--mpi=none --kill-on-bad-exit=0 {launch}{python} -m {SMOKE_DIR}.vet --local-ranks \"$per_node\" 2>&1 || true)",
        '    for node in "${all[@]}"; do',
        '        if [ -z "${answered[$node]:-}" ]; then',
        '            why[$node]="no answer from the vetting step on it (a crash, or 300 s passed)"',
        # a slow node is named as slow first, with whatever else failed on it (at a few percent of a
        # core its allreduce also runs out of time: both are said)
        '        elif [ "${rate[$node]}" -gt 0 ] && [ $(( ${rate[$node]} * ' + str(SLOW_FRACTION) + ' )) -lt "$best" ]; then',
        '            why[$node]="compute ${rate[$node]} Mflop/s, below half of $best_node\'s $best${why[$node]:+; ${why[$node]}}"',
        "        fi",
        '        if [ -n "${why[$node]:-}" ]; then bad+=("$node"); else good+=("$node"); fi',
        "    done",
        '    for node in "${bad[@]+"${bad[@]}"}"; do note "vetting: $node is left out: ${why[$node]}"; done',
        '    note "vetting: ${#good[@]} of ${#all[@]} node(s) passed in $((SECONDS - t0)) s (the job needs $VET_MIN_NODES)"',
        '    if [ "${#good[@]}" -lt "$VET_MIN_NODES" ]; then',
        "        local list=''",
        '        for node in "${bad[@]+"${bad[@]}"}"; do list+="${list:+; }$node: ${why[$node]}"; done',
        '        die "node vetting: ${#good[@]} of ${#all[@]} node(s) passed, the job needs $VET_MIN_NODES'
        ' (cluster.vet_min_nodes or ENVBUILDER_VET_MIN_NODES): $list"',
        "    fi",
        '    if [ "${#bad[@]}" -gt 0 ]; then',
        "        n=${#good[@]}",
        '        rank_opts=(--exclude="$(IFS=,; echo "${bad[*]}")" --nodes="$n" --ntasks="$(( n * ' + tasks + ' ))")',
        *(["        RANK_NODES=$n"] if torchrun else []),
        '        MASTER_ADDR=${good[0]}',
        "    fi",
        "}",
        'if [ "$VET_MIN_NODES" -gt 0 ]; then vet_nodes; fi',
    ]
