"""Hyper-parameter sweeps: a grid (`cluster.sweep` or `--sweep NAME=v1,v2`) becomes a Slurm
job array. Task i gets the i-th combination as environment variables and its own folder.

The order is fixed (names sorted, values as written), so the same spec always numbers the
tasks the same way and writes a byte-identical job script.
"""

from __future__ import annotations

import itertools
import math

from ..errors import EnvbuilderError
from ..quoting import CONTROL_RE
from ..schema import SWEEP_RE

MAX_TASKS = 10000   # Slurm's default MaxArraySize is 1001; sites raise it; beyond this is a typo

# Sweep names become variables of job.sbatch (upper case): they must not replace the script's
# own variables, the shell's, Slurm's or the launchers' (PATH, IFS, OUTPUT_DIR, SLURM_*...).
RESERVED = frozenset("""
    PATH IFS HOME USER SHELL PWD OLDPWD TMPDIR LANG LC_ALL TERM HOSTNAME PS1 PS4 ENV CDPATH
    JOB_DIR IMAGE OUTPUT_DIR CHECKPOINT_DIR TENSORBOARD_DIR LOCAL_ROOT JOB_LOCAL VENV VIRTUAL_ENV
    STAGE_SRC MASTER_ADDR MASTER_PORT RANK LOCAL_RANK WORLD_SIZE TB_PORT SECONDS RANDOM LINENO
    OMP_NUM_THREADS PYTHONPATH PYTHONHOME PYTHONNOUSERSITE CUDA_VISIBLE_DEVICES
""".split())
RESERVED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "ENVBUILDER_", "BASH", "LC_", "LD_",
                     "PYTHON", "PMIX_", "PMI_", "OMPI_", "NCCL_", "GLOO_", "HOROVOD_", "CUDA_",
                     "TORCH_", "KMP_", "TF_", "APPTAINER", "SINGULARITY", "MPI_", "UCX_", "FI_")


def parse_entry(entry: str, where: str = "--sweep") -> tuple[str, tuple[str, ...]]:
    """'lr=0.1,0.01' -> ('LR', ('0.1', '0.01')). Names become upper-case variables."""
    entry = entry.strip()
    if not SWEEP_RE.fullmatch(entry):
        raise EnvbuilderError(where, f"{entry[:60]!r} is not NAME=value1,value2,...",
                              "write e.g. --sweep lr=0.1,0.01 (NAME: letters, digits, _)")
    name, values = entry.split("=", 1)
    upper = name.upper()
    if upper in RESERVED or upper.startswith(RESERVED_PREFIXES):
        raise EnvbuilderError(where, f"the sweep name {name!r} would replace the job script's own variable "
                              f"{upper}", "choose another name (e.g. HP_" + upper.lstrip("_")[:40] + ")")
    vals = tuple(v.strip() for v in values.split(","))
    if any(not v for v in vals) or len(set(vals)) != len(vals):
        raise EnvbuilderError(where, f"{entry[:60]!r} has an empty or repeated value",
                              "list each value once")
    if CONTROL_RE.search(entry):
        raise EnvbuilderError(where, f"{entry[:60]!r} has a control character", "use plain text values")
    return name.upper(), vals


def grid(entries: tuple[str, ...] | list[str]) -> dict[str, tuple[str, ...]]:
    """Merge entries (a later entry for the same name replaces the earlier one)."""
    out: dict[str, tuple[str, ...]] = {}
    for e in entries:
        name, vals = parse_entry(e)
        out[name] = vals
    return dict(sorted(out.items()))


def combinations(g: dict[str, tuple[str, ...]]) -> list[dict[str, str]]:
    """Every combination, in a fixed order: task i is combinations(g)[i]."""
    if not g:
        return []
    names = list(g)
    size = math.prod(len(v) for v in g.values())     # checked before anything is built
    if size > MAX_TASKS:
        raise EnvbuilderError("cluster.sweep", f"the grid has {size} combinations",
                              f"keep it under {MAX_TASKS} (and under the site's MaxArraySize)")
    return [dict(zip(names, values)) for values in itertools.product(*(g[n] for n in names))]


def with_overrides(spec_entries: tuple[str, ...], cli_entries: list[str]) -> tuple[str, ...]:
    """The spec's grid with --sweep entries replacing (or adding) names; canonical text."""
    g = grid(spec_entries)
    g.update(grid(cli_entries))
    return tuple(f"{n}={','.join(v)}" for n, v in sorted(g.items()))
