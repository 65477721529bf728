"""Data staging: copy a dataset once per node to node-local storage (an SSD, a burst buffer's
node-local mount, /tmp) before training, so that every epoch reads locally instead of from the
parallel file system (metadata storms, F8 in shared/research/slurm.md).

`cluster.stage: /scratch/me/dataset` -> the job's node set-up step (one task per node) copies it
to `$JOB_LOCAL/data/<name>` (under `cluster.local_scratch`, `$SLURM_TMPDIR`, `$TMPDIR` or /tmp),
and the ranks find the copy in `$ENVBUILDER_DATA`. The copy is made under a temporary name and
renamed when complete; the folder goes when the job ends (nodelocal.py says who removes it).
"""

from __future__ import annotations

from ...quoting import shell_word
from ...plan.job import JobPlan


def check_lines(plan: JobPlan) -> list[str]:
    """Batch-script lines: resolve and check the source before anything starts."""
    src = plan.stage
    if not src:
        return []
    return [
        "# Data staging (cluster.stage): checked now, copied once per node by node_setup",
        f"STAGE_SRC={shell_word(src, 'cluster.stage')}",
        '[ -e "$STAGE_SRC" ] || die "stage source \'$STAGE_SRC\' does not exist on $(hostname) (cluster.stage)"',
        'STAGE_SRC=$(realpath "$STAGE_SRC")',
        'ENVBUILDER_DATA="$JOB_LOCAL/data/$(basename "$STAGE_SRC")"',
        "export STAGE_SRC ENVBUILDER_DATA",
    ]


def function_lines(plan: JobPlan) -> list[str]:
    if not plan.stage:
        return []
    return [
        "",
        "# Copy the dataset to this node's local storage (run by node_setup, one task per node)",
        "stage_data() {",
        "    local t0=$SECONDS",
        '    mkdir -p "${ENVBUILDER_DATA%/*}"',
        '    rm -rf "$ENVBUILDER_DATA.partial"',
        '    cp -a "$STAGE_SRC" "$ENVBUILDER_DATA.partial"',
        '    mv "$ENVBUILDER_DATA.partial" "$ENVBUILDER_DATA"',
        '    echo "envbuilder: staged $STAGE_SRC to $(hostname):$ENVBUILDER_DATA' +
        ' ($(du -sh "$ENVBUILDER_DATA" | cut -f1), $((SECONDS - t0)) s)" >&2',
        "}",
        "export -f stage_data",
    ]


def image_lines(plan: JobPlan) -> list[str]:
    """Batch-script lines before launch[] is set: with ENVBUILDER_STAGE_IMAGE=1 the ranks start
    from a node-local copy of the image file (the same path on every node), made by node_setup."""
    if not plan.runtime.stages_image:
        return []
    return [
        "# The image staged (ENVBUILDER_STAGE_IMAGE=1): every node copies the image file once to its",
        "# node-local folder (node_setup) and the ranks start from that copy, not from the shared file",
        "# system; it goes with the node-local folder when the job ends",
        'if [ "${ENVBUILDER_STAGE_IMAGE:-0}" = 1 ]; then',
        '    IMAGE_SRC=$(realpath "$IMAGE")',
        '    IMAGE="$JOB_LOCAL/image/${IMAGE_SRC##*/}"',
        "    export IMAGE_SRC IMAGE",
        "fi",
    ]


def image_function_lines(plan: JobPlan) -> list[str]:
    if not plan.runtime.stages_image:
        return []
    return [
        "",
        "# Copy the image file to this node's local storage (ENVBUILDER_STAGE_IMAGE=1; node_setup)",
        "stage_image() {",
        '    [ -n "${IMAGE_SRC:-}" ] || return 0',
        "    local t0=$SECONDS",
        '    mkdir -p "${IMAGE%/*}"',
        '    cp "$IMAGE_SRC" "$IMAGE.partial"',
        '    mv "$IMAGE.partial" "$IMAGE"',
        '    echo "envbuilder: staged the image $IMAGE_SRC to $(hostname):$IMAGE' +
        ' ($(du -sh "$IMAGE" | cut -f1), $((SECONDS - t0)) s)" >&2',
        "}",
        "export -f stage_image",
    ]


def node_setup_lines(plan: JobPlan) -> list[str]:
    return (["    stage_data"] if plan.stage else []) + (["    stage_image"] if plan.runtime.stages_image else [])
