"""The job's node-local folder (`$JOB_LOCAL` = `<local root>/envbuilder.<job id>`: the throw-away
HOME, staged data) and who removes it when the job ends, strongest first (`cluster.local_cleanup`,
a site profile's key; JobPlan.cleanup):

    slurm    the local root is a per-job folder that Slurm or the site removes at job end
             (job_container/tmpfs: the job's private /tmp under BasePath; a per-job $TMPDIR the
             site's epilog removes): job.sbatch stages into it and removes nothing itself
    epilog   the site runs slurm-epilog.sh (written beside job.sbatch) as its node Epilog: slurmd
             runs it as root on every node of the job at its end, also after scancel, a time
             limit or a lost batch script; job.sbatch removes nothing itself
    job      (default, no admin needed) job.sbatch removes the folders itself: one step per node
             creates the folder (after its trap is set), stages, reports ready and then waits;
             it removes the folder when told (the normal end) or when Slurm signals the job
             (scancel, time limit: TERM, then KILL after KillWait). CI once saw, after a time limit
             under load, both nodes' folders emptied but left: a removal cut short. What can cut
             it short: a further signal to the step's processes (the rm dies of it: the traps now
             ignore further signals, and so do the rm and find they start) and a KILL (KillWait
             over, or srun ending its step): slurmstepd also runs a task epilog after the node
             step's task ends however it ended (`srun --task-epilog`, a file the batch script
             writes into the run's output folder), which finishes the removal. The batch script's
             own traps cover the batch node before that step is up. What still stays (the node
             lost, an output folder mounted noexec) is removed by the next envbuilder job of the
             same user on that node, once Slurm says the old job is over: a leak lasts one job at
             most.

Every folder carries a marker (`.envbuilder-job`, the job id), removed last. The removals take only
a real folder (never a link) owned by the job's user, with the marker or else empty (a removal cut
short), and do not cross into another file system; no name is globbed or evaluated but the sweep's
own `envbuilder.*` listing.
"""

from __future__ import annotations

from pathlib import Path

from ...quoting import shell_word
from ...plan.job import JobPlan

MARKER = ".envbuilder-job"
EPILOG = "slurm-epilog.sh"
READY = "envbuilder-node"          # what each node's step prints when its set-up is done
# the states after which a job's folder is stale (squeue -t all)
ENDED = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT")


def remove_marked_lines() -> list[str]:
    """remove_marked DIR: DIR is a real folder of this user (checked by the caller). Everything but
    the marker goes first, the marker and the folder last: a removal cut short by a KILL leaves the
    folder marked (the task epilog or a later sweep finishes it) or empty (removed with rmdir)."""
    return [
        "remove_marked() {",
        f'    find "$1" -mindepth 1 -maxdepth 1 ! -name {MARKER} -exec rm -rf --one-file-system -- {{}} + 2>/dev/null || true',
        f'    if [ -z "$(find "$1" -mindepth 1 -maxdepth 1 ! -name {MARKER} -print -quit 2>/dev/null)" ]; then',
        f'        rm -f -- "$1/{MARKER}"',
        '        rmdir -- "$1" 2>/dev/null || true',
        "    fi",
        "}",
    ]


def batch_lines(plan: JobPlan) -> list[str]:
    """After JOB_LOCAL is set: the folder's make/remove functions and the batch script's traps,
    set before anything is made on this node."""
    m = plan.cleanup
    out = [
        "# The folder is this user's own (mode 700; a name someone else made first, or a link, stops",
        "# the job) and carries a marker naming the job: only marked folders are ever removed",
        "own_folder() {   # a real folder (not a link) of this user",
        '    [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ]',
        "}",
        "make_job_local() {",
        '    mkdir -p "${JOB_LOCAL%/*}"',
        '    if ! mkdir -m 700 "$JOB_LOCAL" 2>/dev/null && ! own_folder "$JOB_LOCAL"; then',
        '        die "cannot make the node-local folder $(hostname):$JOB_LOCAL (a link, or not yours?)"',
        "    fi",
        f'    printf \'%s\\n\' "${{SLURM_JOB_ID:-$$}}" > "$JOB_LOCAL/{MARKER}"',
        '    mkdir -p "$HOME"',
        "}",
    ]
    if m == "job":
        out += [
            *remove_marked_lines(),
            "remove_job_local() {",
            f'    if own_folder "$JOB_LOCAL" && [ -f "$JOB_LOCAL/{MARKER}" ]; then remove_marked "$JOB_LOCAL"; fi',
            "}",
        ]
    if m == "slurm":
        out.append("# cluster.local_cleanup: slurm: Slurm (or the site) removes the local root with the job")
    elif m == "epilog":
        out.append(f"# cluster.local_cleanup: epilog: the site's node Epilog ({EPILOG}) removes the folders")
    out += [
        "# Whatever ends the script (the end, an error, scancel, the time limit: Slurm sends TERM,",
        "# then KILL after KillWait), cleanup runs" + (": it tells the node steps to remove their" if m == "job"
                                                       else ""),
        *(["# folders, waits for them, then removes this node's folder if no step did"] if m == "job" else []),
        "tb_pid=''" + (" keeper_pid=''" if m == "job" else ""),
        "cleanup() {",
        "    # a further signal must not cut the cleanup or its commands short:",
        "    # ignored here, and so in every command it starts",
        "    trap '' TERM INT HUP",
        '    if [ -n "$tb_pid" ]; then kill "$tb_pid" 2>/dev/null || true; fi',
        *plan.runtime.cleanup,
    ]
    if m == "job":
        out += [
            "    # USR1, not TERM: srun turns a TERM into an outright kill of its tasks",
            '    if [ -n "$keeper_pid" ] && kill -USR1 "$keeper_pid" 2>/dev/null; then',
            '        wait "$keeper_pid" 2>/dev/null || true',
            "    fi",
            "    remove_job_local",
        ]
    out += [
        "}",
        "trap cleanup EXIT",
        "trap 'exit 143' TERM",
        "trap 'exit 130' INT",
        "trap 'exit 129' HUP",
        "export -f own_folder make_job_local" + (" remove_marked remove_job_local" if m == "job" else ""),
    ]
    return out


def function_lines(plan: JobPlan) -> list[str]:
    """node_step: what the one task per node runs (after node_setup is defined)."""
    if plan.cleanup != "job":
        return [
            "",
            "# One task per node: the node-local folder, then node_setup",
            "node_step() {",
            "    make_job_local",
            "    node_setup",
            "}",
            "export -f node_step",
        ]
    ended = "|".join(ENDED)
    return [
        "",
        "# Folders left on this node by this user's earlier envbuilder jobs whose own cleanup never",
        "# ran (a step killed outright, a node lost): removed once Slurm says that job is over",
        "sweep_stale() {",
        "    local d id state",
        '    for d in "${JOB_LOCAL%/*}"/envbuilder.*; do',
        "        own_folder \"$d\" || continue",
        f'        if [ ! -f "$d/{MARKER}" ] && [ -n "$(find "$d" -mindepth 1 -print -quit 2>/dev/null)" ]; then',
        "            continue   # not marked, not empty: not known to be envbuilder's",
        "        fi",
        "        id=${d##*/envbuilder.}",
        '        case $id in ""|*[!0-9]*) continue ;; esac',
        '        [ "$id" != "${SLURM_JOB_ID:-}" ] || continue',
        '        if state=$(squeue -h -t all -j "$id" -o %T 2>&1); then',
        f"            case $state in {ended}) ;; *) continue ;; esac",
        "        else",
        '            case $state in *"Invalid job id"*) ;; *) continue ;; esac   # purged: long over',
        "        fi",
        '        note "removing $(hostname):$d, left by job $id (${state:-ended})"',
        '        if [ -f "$d/' + MARKER + '" ]; then remove_marked "$d"; else rmdir -- "$d" 2>/dev/null || true; fi',
        "    done",
        "}",
        "# One task per node for the job's length: its trap is set before the folder is made, so",
        "# whenever the step ends (told with USR1 at the end; TERM: scancel, time limit) the folder",
        "# goes with it. It reports the set-up's result on stdout, then waits",
        "node_step() {",
        "    # a further signal must not cut the removal short: ignored from here on, and so in the",
        "    # rm and find it starts",
        "    trap \"trap '' USR1 TERM INT HUP; remove_job_local; exit 0\" USR1 TERM INT HUP",
        "    local rc=0",
        "    (make_job_local) || rc=$?",
        '    if [ "$rc" = 0 ]; then',
        "        sweep_stale || true",
        "        (node_setup) || rc=$?",
        "    fi",
        f'    echo "{READY} $rc $(hostname)"',
        "    # the sleep holds no output of the step: when a signal ends the wait, the step's output",
        "    # closes as the step exits, not when the sleep left behind ends (up to 1 s later)",
        "    while :; do sleep 1 >/dev/null 2>&1 & wait $! || true; done",
        "}",
        "export -f sweep_stale node_step",
    ]


TASK_EPILOG = ".envbuilder-node-epilog"   # in the run's output folder (on every node)


def task_epilog_lines() -> list[str]:
    """The node step's task epilog: written by the batch script (static text, a quoted here-document),
    run by slurmstepd as the user on each node after the node step's task ends, with the step's
    environment ($JOB_LOCAL) and a 5 s limit. Its PATH is the system's: it runs rm and nothing
    the job's environment chose."""
    return [
        "# After the node step's task ends, however it ended, slurmstepd runs this on its node",
        "# (srun --task-epilog): a KILL (KillWait over, srun ending its step) can cut the step's own",
        "# removal short",
        f'node_epilog="$OUTPUT_DIR/{TASK_EPILOG}"',
        "cat > \"$node_epilog\" <<'ENVBUILDER_TASK_EPILOG'",
        "#!/bin/bash",
        "# envbuilder: removes this job's node-local folder when its node step ends (written by job.sbatch)",
        "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
        *remove_marked_lines(),
        'd=${JOB_LOCAL:-}',
        'case $d in /*/envbuilder.[0-9]*) ;; *) exit 0 ;; esac',
        "for _ in 1 2 3 4 5 6 7 8; do",
        '    if [ ! -d "$d" ] || [ -L "$d" ] || [ ! -O "$d" ]; then exit 0; fi',
        f'    if [ -f "$d/{MARKER}" ]; then remove_marked "$d"; else rmdir -- "$d" 2>/dev/null || exit 0; fi',
        '    [ -e "$d" ] || exit 0',
        "    sleep 0.5   # a rank still writing into it as it dies",
        "done",
        "ENVBUILDER_TASK_EPILOG",
        'chmod 700 "$node_epilog"',
    ]


def launch_lines(plan: JobPlan) -> list[str]:
    """The node step in the batch script."""
    tasks = '--ntasks-per-node=1 --ntasks="${SLURM_JOB_NUM_NODES:-1}" --mpi=none'
    if plan.cleanup != "job":
        return ["", "# Node set-up step (one task per node)", f"srun {tasks} bash -c node_step"]
    return [
        "",
        "# Node set-up step: one task per node that stays for the job's length (it removes the",
        "# node-local folder at the end); the script goes on when every node reported its set-up",
        'node_fifo="$JOB_LOCAL/.node-steps"',
        'make_job_local',
        'rm -f "$node_fifo"',
        'mkfifo "$node_fifo"',
        *task_epilog_lines(),
        f'srun --overlap --kill-on-bad-exit=0 --task-epilog="$node_epilog" {tasks} bash -c node_step'
        ' > "$node_fifo" &',
        "keeper_pid=$!",
        'exec {node_fd}<"$node_fifo"',
        'rm -f "$node_fifo"',
        "nodes_ready=0 node_rc=0",
        'while [ "$nodes_ready" -lt "${SLURM_JOB_NUM_NODES:-1}" ] && IFS= read -r line <&"$node_fd"; do',
        "    case $line in",
        f'        "{READY} "*) nodes_ready=$((nodes_ready + 1)); line=${{line#{READY} }}',
        '            if [ "${line%% *}" != 0 ]; then node_rc=${line%% *}; fi ;;',
        "        *) printf '%s\\n' \"$line\" ;;",
        "    esac",
        "done",
        'if [ "$node_rc" != 0 ]; then exit "$node_rc"; fi',
        'if [ "$nodes_ready" -lt "${SLURM_JOB_NUM_NODES:-1}" ]; then',
        '    rc=0; wait "$keeper_pid" || rc=$?',
        "    keeper_pid=''",
        '    die "the node set-up step ended before every node was ready (srun exit $rc)"',
        "fi",
    ]


EPILOG_TEMPLATE = Path(__file__).resolve().parents[2] / "data" / "node-epilog.sh"
ROOTS_LINE = "ROOTS=(/tmp)\n"        # the template's line that names the local roots


def epilog_text(root: str | None) -> str:
    """The template with the site's local root (tools/minicluster installs it the same way)."""
    text = EPILOG_TEMPLATE.read_text()
    assert text.count(ROOTS_LINE) == 1
    if root:
        return text.replace(ROOTS_LINE, f"ROOTS=({shell_word(root, 'cluster.local_scratch')})\n")
    return text.replace(ROOTS_LINE, "# local_scratch is not a literal path in the site profile: name the\n"
                        "# folder(s) your users' jobs use\n" + ROOTS_LINE)
