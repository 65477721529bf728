"""Helpers shared by the launcher, the rank wrapper and the worker.

Standard library only, Python >= 3.8 syntax: this folder is copied into images as
``envbuilder_smoke`` and must run on whatever Python the image has.
"""

import ctypes
import json
import os
import re
import signal
import tempfile
import time

REPORT_SCHEMA = "envbuilder.smoke-report/1"
BEGIN_MARKER = "=====ENVBUILDER-SMOKE-REPORT-BEGIN====="
END_MARKER = "=====ENVBUILDER-SMOKE-REPORT-END====="

PASS = "pass"
FAIL = "fail"
SKIP = "skip"

# Test hook (not a user option): ENVBUILDER_SMOKE_FAULT=KIND:RANK[:CHECK]
# KIND is hang or crash (the worker, at the start of CHECK, a check-name prefix; default: the
# first allreduce check) or linger (the rank wrapper stays 4 s after writing its exit record, as
# a descheduled process on a loaded node does).
FAULT_ENV = "ENVBUILDER_SMOKE_FAULT"

FRAMEWORK_MODULES = {
    "tensorflow": "tensorflow",
    "tensorflow-cpu": "tensorflow",
    "tensorflow-gpu": "tensorflow",
    "intel-tensorflow": "tensorflow",
    "pytorch": "torch",
    "torch": "torch",
}


GPU_LEFT_OUT = "GPU checks left out (--no-gpu): this image is not verified on a GPU"


def gpu_absent(expect, no_gpu):
    """(status, detail) of a GPU check that cannot run because no GPU is visible. An image built
    for GPUs is never reported as verified without one: the check fails, unless the user said
    --no-gpu, and then the report says the GPU checks were left out."""
    if not expect.get("gpu"):
        return SKIP, "no GPU (CPU image)"
    if no_gpu:
        return SKIP, "not run: no GPU visible; left out (--no-gpu)"
    hint = driver_not_brought_in(gpu_device_files(), driver_library_loads(), os.environ)
    if hint:
        return FAIL, "not run: " + hint
    return FAIL, ("not run: no GPU visible (the image is built for GPUs: run verify on a GPU node, "
                  "or pass --no-gpu to leave the GPU checks out)")


def gpu_device_files(dev="/dev"):
    """The NVIDIA device files in /dev (nvidiactl, nvidia0, ...): a container runtime that binds
    the host's /dev (Apptainer does by default) shows them even where it brought no driver in."""
    try:
        return sorted(n for n in os.listdir(dev) if re.fullmatch(r"nvidia(ctl|\d+)", n))
    except OSError:
        return []


def driver_library_loads():
    """The NVIDIA driver's user-space library (libcuda.so.1) can be loaded in this process."""
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def driver_not_brought_in(device_files, libcuda_loads, env):
    """Why no GPU is visible when the node has one, or None: its device files are there but the
    driver's library is not, which is what a container runtime started without its GPU option
    gives (Apptainer/Singularity without --nv: /dev is bound, the driver's libraries are not)."""
    if not device_files or libcuda_loads:
        return None
    seen = "the node's GPU device files are visible (%s) but the driver library libcuda.so.1 is not" % (
        ", ".join("/dev/" + n for n in device_files[:3]))
    if env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER"):
        return seen + ": Apptainer/Singularity brings the driver in only with --nv (apptainer exec --nv IMAGE.sif ...)"
    return seen + (": start the container with the runtime's GPU option (Apptainer/Singularity --nv, "
                   "Docker --gpus all, podman --device nvidia.com/gpu=all, enroot/pyxis with "
                   "NVIDIA_VISIBLE_DEVICES set)")



def pmi_pass_fds():
    """The descriptors Slurm's PMI-2 hands a task (PMI_FD, PMI_CMD_FD): a child process that calls
    MPI_Init in the task's place must inherit them (subprocess closes every other descriptor)."""
    return tuple(int(os.environ[v]) for v in ("PMI_FD", "PMI_CMD_FD") if os.environ.get(v, "").isdigit())


def result(name, status, detail="", figure="", data=None):
    """One check result as a plain dict (JSON ready)."""
    out = {"name": name, "status": status, "detail": detail, "figure": figure}
    if data is not None:
        out["data"] = data
    return out


# ----------------------------------------------------------------------------- versions

_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(.*)$")


def parse_release(text):
    """'2.13.0+cpu' -> ((2, 13, 0), '+cpu'); None when there is no leading release."""
    if text is None:
        return None
    m = _RELEASE.match(str(text))
    if not m:
        return None
    return tuple(int(p) for p in m.group(1).split(".")), m.group(2)


def version_matches(expected, installed):
    """Release-prefix match of the manifest contract.

    '3.11' matches '3.11.2'; '2.13.0' matches '2.13.0+cpu'; '2.13.0' does not match
    '2.13.1' nor '2.13.0rc1' (a pre-release is not the release). An expected version
    with a suffix of its own ('2.13.0rc1', '1.0.post1') must match exactly; an expected
    local label ('2.13.0+cpu') must be the installed one.
    """
    if expected is None:
        return True
    if installed is None:
        return False
    exp = parse_release(expected)
    inst = parse_release(installed)
    if exp is None or inst is None:
        return str(expected).strip() == str(installed).strip()
    exp_rel, exp_rest = exp
    inst_rel, inst_rest = inst
    if inst_rel[:len(exp_rel)] != exp_rel:
        return False
    exp_suffix, _, exp_local = exp_rest.partition("+")
    inst_suffix, _, inst_local = inst_rest.partition("+")
    if exp_local and exp_local != inst_local:
        return False  # '2.13.0+cpu' asks for the CPU build: '2.13.0+cu121' is not it
    if exp_suffix:
        return len(inst_rel) == len(exp_rel) and inst_suffix == exp_suffix
    if len(inst_rel) == len(exp_rel):
        # '2.13.0' vs '2.13.0rc1' / '2.13.0.dev3': a pre/dev release is not the release
        return not re.match(r"^[.\-_]?(a|b|c|rc|alpha|beta|pre|preview|dev)\d*", inst_suffix)
    return True


# ----------------------------------------------------------------------------- files

def write_text_atomic(path, text):
    """Write text so that a reader never sees half a file (a temporary file beside it, renamed
    over it; 0666 less the umask). The image-side twin of envbuilder/output.py write_atomic:
    this suite is stdlib-only and cannot import envbuilder."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path, obj):
    """Write JSON so that a reader never sees half a file."""
    write_text_atomic(path, json.dumps(obj, default=str))


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def rank_file(workdir, rank):
    return os.path.join(workdir, "rank-%d.json" % rank)


def exit_file(workdir, rank):
    return os.path.join(workdir, "rank-%d.exit.json" % rank)


# ----------------------------------------------------------------------------- environment

# ENVBUILDER_SMOKE_*: the suite's own spawner (torch.distributed runs); ROLE_RANK, WORLD_SIZE,
# LOCAL_RANK, LOCAL_WORLD_SIZE: torchrun's (one srun task per node, so before the SLURM_ ones)
RANK_ENV = ("ENVBUILDER_SMOKE_RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
            "MV2_COMM_WORLD_RANK", "ROLE_RANK", "SLURM_PROCID")
SIZE_ENV = ("ENVBUILDER_SMOKE_SIZE", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
            "MV2_COMM_WORLD_SIZE", "ROLE_WORLD_SIZE", "SLURM_NTASKS")
LOCAL_RANK_ENV = ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                  "MV2_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID")
LOCAL_SIZE_ENV = ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                  "MV2_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE")


def _env_int(names, default):
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                continue
    return default


def env_rank():
    """This process's rank as the launcher (horovodrun, mpirun, srun) told it."""
    return _env_int(RANK_ENV, 0)


def env_size():
    return _env_int(SIZE_ENV, 1)


def env_local_rank():
    return _env_int(LOCAL_RANK_ENV, env_rank())


def env_local_size():
    size = _env_int(LOCAL_SIZE_ENV, 0)
    if size:
        return size
    tasks = os.environ.get("SLURM_TASKS_PER_NODE", "")
    m = re.match(r"^(\d+)", tasks)
    if m:
        return int(m.group(1))
    return env_size()


def scaled_base_lr(size, base=0.02, largest=0.16):
    """Per-rank base learning rate of the training check. The check scales it by the number of
    ranks (with warm-up); past 8 ranks the base shrinks so the scaled rate stays <= LARGEST,
    which this tiny problem tolerates (linear scaling has its limits, Goyal et al. 2017)."""
    return min(base, largest / max(1, size))


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_per_rank(local_ranks):
    return max(1, cpu_count() // max(1, local_ranks))


def parse_fault(spec):
    """'hang:1' -> ('hang', 1, None); 'crash:0:train' -> ('crash', 0, 'train'); 'linger:0'."""
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) < 2 or parts[0] not in ("hang", "crash", "linger"):
        return None
    try:
        rank = int(parts[1])
    except ValueError:
        return None
    return parts[0], rank, (parts[2] if len(parts) > 2 and parts[2] else None)


def signal_name(num):
    try:
        return signal.Signals(num).name
    except (ValueError, AttributeError):
        return "signal %d" % num


def describe_exit(code):
    """Popen.returncode -> words ('exit code 3', 'killed by SIGSEGV')."""
    if code is None:
        return "still running"
    if code < 0:
        return "killed by %s" % signal_name(-code)
    if code > 128 and code - 128 < 65:
        return "exit code %d (%s?)" % (code, signal_name(code - 128))
    return "exit code %d" % code


def now():
    return time.time()


def fmt_bytes(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / float(size)
            return ("%d %s" % (value, unit)) if value == int(value) else ("%.1f %s" % (value, unit))
    return "%d B" % n


def fmt_rate(bytes_per_s):
    if bytes_per_s >= 1e9:
        return "%.2f GB/s" % (bytes_per_s / 1e9)
    if bytes_per_s >= 1e6:
        return "%.1f MB/s" % (bytes_per_s / 1e6)
    return "%.1f kB/s" % (bytes_per_s / 1e3)


def bandwidth_row(nbytes, secs, reps, size):
    """One message size of an allreduce timing: algorithm and bus bandwidth (nccl-tests'
    busbw = algbw x 2(n-1)/n)."""
    algbw = nbytes / secs
    busbw = algbw * 2.0 * (size - 1) / size if size > 1 else algbw
    return {"bytes": nbytes, "time_us": round(secs * 1e6, 1), "reps": reps,
            "algbw_GBps": round(algbw / 1e9, 4), "busbw_GBps": round(busbw / 1e9, 4)}


def bandwidth_result(name, rows, what):
    """The perf result of bandwidth_row()s: 'WHAT: 4 KiB x GB/s (t us); ...', figure at the largest."""
    parts = ["%s %s (%.0f us)" % (fmt_bytes(r["bytes"]), fmt_rate(r["busbw_GBps"] * 1e9), r["time_us"])
             for r in rows]
    big = rows[-1]
    return result(name, PASS, "%s: %s" % (what, "; ".join(parts)),
                  "%s @ %s" % (fmt_rate(big["busbw_GBps"] * 1e9), fmt_bytes(big["bytes"])), {"sizes": rows})
