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
from ..redact import credential_in, secret_name
from ..spec.schema import RUN_TIME_FIX, SWEEP_RE, shown

MAX_TASKS = 10000   # Slurm's default MaxArraySize is 1001; sites raise it; beyond this is a typo

# Sweep names become variables of job.sbatch (upper case): they must not replace the script's
# own variables, the shell's, Slurm's or the launchers' (PATH, IFS, OUTPUT_DIR, SLURM_*...).
# tests/test_hardening.py renders job scripts of every kind and checks that every variable they
# set or read is refused here (the script's own list comes from render/sbatch.py's output).
BASH_OWN = frozenset("""
    BASH BASHOPTS BASHPID BASH_ALIASES BASH_ARGC BASH_ARGV BASH_ARGV0 BASH_CMDS BASH_COMMAND
    BASH_ENV BASH_EXECUTION_STRING BASH_LINENO BASH_LOADABLES_PATH BASH_REMATCH BASH_SOURCE
    BASH_SUBSHELL BASH_VERSINFO BASH_VERSION BASH_XTRACEFD CDPATH CHILD_MAX COLUMNS COMP_CWORD
    COMP_LINE COMP_POINT COMP_TYPE COMP_KEY COMP_WORDBREAKS COMP_WORDS COMPREPLY COPROC DIRSTACK
    EMACS ENV EPOCHREALTIME EPOCHSECONDS EUID EXECIGNORE FCEDIT FIGNORE FUNCNAME FUNCNEST GLOBIGNORE
    GROUPS HISTCMD HISTCONTROL HISTFILE HISTFILESIZE HISTIGNORE HISTSIZE HISTTIMEFORMAT HOME
    HOSTFILE HOSTNAME HOSTTYPE IFS IGNOREEOF INPUTRC INSIDE_EMACS LANG LINENO LINES MACHTYPE MAIL
    MAILCHECK MAILPATH MAPFILE OLDPWD OPTARG OPTERR OPTIND OSTYPE PATH PIPESTATUS POSIXLY_CORRECT
    PPID PROMPT_COMMAND PROMPT_DIRTRIM PS0 PS1 PS2 PS3 PS4 PWD RANDOM READLINE_ARGUMENT
    READLINE_LINE READLINE_MARK READLINE_POINT REPLY SECONDS SHELL SHELLOPTS SHLVL SRANDOM TIMEFORMAT
    TMOUT TMPDIR UID USER LOGNAME TERM TZ
""".split())   # the bash manual, "Shell Variables" (bash 5.2)
RESERVED = BASH_OWN | frozenset("""
    JOB_DIR IMAGE IMAGE_SRC OUTPUT_DIR CHECKPOINT_DIR TENSORBOARD_DIR LOCAL_ROOT JOB_LOCAL VENV VIRTUAL_ENV
    STAGE_SRC MASTER_ADDR MASTER_PORT RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK
    ROLE_RANK ROLE_NAME ROLE_WORLD_SIZE GROUP_WORLD_SIZE RANKS_PER_NODE TB_PORT OMP_NUM_THREADS
    PYTHONPATH PYTHONHOME PYTHONNOUSERSITE CUDA_VISIBLE_DEVICES NETRC
""".split())
RESERVED_PREFIXES = ("SLURM_", "SLURMD_", "SBATCH_", "SRUN_", "SALLOC_", "ENVBUILDER_", "BASH", "LC_", "LD_",
                     "PYTHON", "PMIX_", "PMI_", "OMPI_", "NCCL_", "GLOO_", "HOROVOD_", "CUDA_",
                     "TORCH", "KMP_", "TF_", "APPTAINER", "SINGULARITY", "MPI_", "UCX_", "FI_",
                     "COMP_", "READLINE_", "I_MPI_", "HYDRA_", "MV2_", "PALS_")


def _owner(upper: str) -> str:
    if upper in BASH_OWN or upper.startswith(("BASH", "COMP_", "READLINE_")):
        return "bash sets or reads it"
    if upper.startswith(("SLURM_", "SLURMD_", "SBATCH_", "SRUN_", "SALLOC_")):
        return "Slurm sets or reads it"
    if upper.startswith(("LD_", "PYTHON")):
        return "it changes what programs load"
    return "the job script or a launcher (srun, torchrun, MPI) sets or reads it"


def parse_entry(entry: str, where: str = "--sweep") -> tuple[str, tuple[str, ...]]:
    """'lr=0.1,0.01' -> ('LR', ('0.1', '0.01')). Names become upper-case variables."""
    entry = entry.strip()
    if not SWEEP_RE.fullmatch(entry):
        raise EnvbuilderError(where, f"{shown(entry)} is not NAME=value1,value2,...",
                              "write e.g. --sweep lr=0.1,0.01 (NAME: letters, digits, _)")
    name, values = entry.split("=", 1)
    upper = name.upper()
    if upper in RESERVED or upper.startswith(RESERVED_PREFIXES):
        raise EnvbuilderError(where, f"the sweep name {name!r} would replace the variable {upper}: "
                              f"{_owner(upper)}, so the job would break",
                              "choose another name (e.g. HP_" + upper.lstrip("_")[:40] + ")")
    what = credential_in(values)
    if what or secret_name(upper):
        reason = f"{shown(entry)} holds {what}" if what else f"the sweep name {name!r} looks like a secret's"
        raise EnvbuilderError(where, reason + ": job.sbatch and manifest.json would hold it in clear text",
                              RUN_TIME_FIX)
    vals = tuple(v.strip() for v in values.split(","))
    if any(not v for v in vals) or len(set(vals)) != len(vals):
        raise EnvbuilderError(where, f"{shown(entry)} has an empty or repeated value",
                              "list each value once")
    if CONTROL_RE.search(entry):
        raise EnvbuilderError(where, f"{shown(entry)} has a control character", "use plain text values")
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
