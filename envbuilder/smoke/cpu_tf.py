"""What makes a CPU TensorFlow image what it claims to be: which PyPI distribution provides the
imported framework (intel-tensorflow, tensorflow-cpu and tensorflow all install the same
`tensorflow` package), whether oneDNN is on in the running process (TensorFlow's own flag), and
whether the oneDNN / OpenMP settings of the image and job.sbatch (manifest expect.cpu_env,
OMP_NUM_THREADS) reach every rank.

Standard library + the framework only; Python >= 3.8.
"""

import os
import re

from .common import FAIL, PASS, SKIP, result, version_matches

# The launcher tells each rank which OMP_NUM_THREADS it should see and who decided it:
# "VALUE|SOURCE" (plan.run_env). Absent: no expectation (a rank started by hand).
OMP_EXPECT_ENV = "ENVBUILDER_SMOKE_OMP_EXPECT"

# oneDNN is on in this process: TensorFlow's own answer, tensorflow/core/util/port.cc
# IsMklEnabled() (bound as tensorflow.python.util._pywrap_util_port.IsMklEnabled, which TF's
# test_util.IsMklEnabled calls). In an --config=mkl build (ENABLE_MKL: intel-tensorflow) it is
# true unless TF_DISABLE_MKL=1; in stock Linux x86 wheels it is TF_ENABLE_ONEDNN_OPTS, else the
# CPU's features (AVX512_VNNI, AVX512_BF16, AVX_VNNI, AMX). Read once per process. Checked by
# hand in the intel-tensorflow 2.14.0 image of recipes/intel-tf-cpu-debian.yaml (2026-11-25):
# True; False with TF_DISABLE_MKL=1; still True with TF_ENABLE_ONEDNN_OPTS=0 (the ENABLE_MKL
# build). In tensorflow-cpu 2.15.1: False with TF_ENABLE_ONEDNN_OPTS=0 (tests/test_smoke_suite.py).
# intel-tensorflow loads Intel's OpenMP (libiomp5.so), which reads the KMP_* variables.
ONEDNN_FLAG = "tensorflow.python.util._pywrap_util_port.IsMklEnabled()"


def canonical(name):
    """PEP 503 name: 'Intel_TensorFlow' -> 'intel-tensorflow'."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def _package_dir(module):
    """('tensorflow', '/opt/venv/lib/python3.11/site-packages') for the imported package."""
    init = os.path.realpath(getattr(module, "__file__", "") or "")
    pkg_dir = os.path.dirname(init)
    return os.path.basename(pkg_dir), os.path.dirname(pkg_dir), init


def distribution_owners(module):
    """(owners of the module's __init__.py, other distributions with files in its package folder,
    the module's file). Each a list of (canonical name, version), from the RECORD files that
    importlib.metadata reads."""
    from importlib import metadata
    top, root, init = _package_dir(module)
    owners, others = [], []
    if not top:
        return owners, others, init
    rel_init = "%s/__init__.py" % top
    prefix = top + "/"
    seen = set()
    for dist in metadata.distributions():
        name = canonical(dist.metadata["Name"] or "")
        if name in seen:
            continue
        files = dist.files or []
        in_pkg = [f for f in files if str(f).replace("\\", "/").startswith(prefix)]
        if not in_pkg:
            continue
        seen.add(name)
        owns = False
        for f in in_pkg:
            if str(f).replace("\\", "/") == rel_init:
                try:
                    owns = os.path.realpath(str(dist.locate_file(f))) == init
                except Exception:  # noqa: BLE001 - a broken RECORD: not the owner
                    owns = False
                break
        (owners if owns else others).append((name, dist.version))
    return owners, others, init


def check_distribution(expect, fw_mod):
    """framework.distribution: the manifest's distribution is installed at the manifest's
    version and owns the imported module's files; no other distribution provides them."""
    fw = expect.get("framework") or {}
    want = fw.get("distribution")
    if not want:
        return result("framework.distribution", SKIP, "manifest names no distribution (the base "
                      "image brings the framework, or an older manifest)")
    if fw_mod is None:
        return result("framework.distribution", FAIL, "%s: the framework did not import" % want,
                      figure="missing")
    try:
        owners, others, init = distribution_owners(fw_mod)
    except Exception as exc:  # noqa: BLE001 - importlib.metadata missing (Python < 3.8)
        return result("framework.distribution", SKIP, "cannot read distribution metadata: %s" % exc)
    data = {"module_file": init, "owners": ["%s %s" % o for o in owners],
            "others": ["%s %s" % o for o in others]}
    problems = []
    mine = [o for o in owners if o[0] == canonical(want)]
    if not mine:
        problems.append("%s does not own %s (owned by: %s)" % (
            want, init, ", ".join("%s %s" % o for o in owners) or "no installed distribution"))
    elif fw.get("version") and not version_matches(fw["version"], mine[0][1]):
        problems.append("%s %s installed, manifest expects %s" % (want, mine[0][1], fw["version"]))
    rivals = [o for o in owners + others if o[0] != canonical(want)]
    if rivals:
        problems.append("also installed with files in %s/: %s" % (
            os.path.basename(os.path.dirname(init)), ", ".join("%s %s" % o for o in rivals)))
    if problems:
        return result("framework.distribution", FAIL, "; ".join(problems),
                      figure=", ".join("%s %s" % o for o in owners) or "unowned", data=data)
    return result("framework.distribution", PASS, "%s %s owns %s (importlib.metadata RECORD); no other "
                  "distribution has files in its package" % (mine[0][0], mine[0][1], init),
                  figure="%s %s" % mine[0], data=data)


def onednn_state(tf):
    """(True/False/None, how it was read) for oneDNN in this process."""
    try:
        from tensorflow.python.util import _pywrap_util_port as port
    except Exception as exc:  # noqa: BLE001
        return None, "cannot import _pywrap_util_port: %s" % exc
    fn = getattr(port, "IsMklEnabled", None)
    if fn is None:
        return None, "this TensorFlow has no _pywrap_util_port.IsMklEnabled"
    return bool(fn()), ONEDNN_FLAG


def onednn_kernels():
    """oneDNN op kernels registered in this TensorFlow (the graph rewrite targets them)."""
    try:
        from tensorflow.python.framework import op_def_registry
    except Exception:  # noqa: BLE001
        return None
    return [op for op in ("_MklConv2D", "_MklMatMul", "_MklNativeConv2D", "_MklFusedMatMul")
            if op_def_registry.get(op) is not None]


def onednn_wanted(expect):
    return str((expect.get("cpu_env") or {}).get("TF_ENABLE_ONEDNN_OPTS", "")) == "1"


def check_onednn(expect, fw_mod):
    """framework.onednn: TensorFlow says oneDNN is on in this process (not the variable alone)."""
    if not onednn_wanted(expect):
        return result("framework.onednn", SKIP, "manifest does not ask for oneDNN (no cpu_env "
                      "TF_ENABLE_ONEDNN_OPTS=1)")
    if fw_mod is None:
        return result("framework.onednn", FAIL, "the framework did not import", figure="missing")
    on, how = onednn_state(fw_mod)
    kernels = onednn_kernels()
    data = {"is_mkl_enabled": on, "read_by": how, "kernels": kernels,
            "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
            "TF_DISABLE_MKL": os.environ.get("TF_DISABLE_MKL")}
    env = "TF_ENABLE_ONEDNN_OPTS=%s" % os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset")
    if on is None:
        return result("framework.onednn", FAIL, "oneDNN state unknown: %s (%s)" % (how, env),
                      figure="unknown", data=data)
    if not on:
        return result("framework.onednn", FAIL, "%s is False: oneDNN is off in this process (%s, "
                      "TF_DISABLE_MKL=%s)" % (how, env, os.environ.get("TF_DISABLE_MKL", "unset")),
                      figure="off", data=data)
    return result("framework.onednn", PASS, "%s is True (%s); oneDNN kernels registered: %s" % (
        how, env, ", ".join(kernels or []) or "none found"), figure="on", data=data)


def expected_omp():
    """(value or None, who decided it) from the launcher's note."""
    note = os.environ.get(OMP_EXPECT_ENV, "")
    if not note:
        return None, ""
    value, _, source = note.partition("|")
    return value, source


def openmp_runtimes():
    """OpenMP runtimes mapped into this process (libiomp5: Intel's, reads KMP_*; libgomp: GNU's)."""
    found = []
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split(None, 5)[-1].strip()
                base = os.path.basename(path)
                if re.match(r"lib(iomp5|gomp|omp)\b.*\.so", base) and base not in found:
                    found.append(base)
    except OSError:
        pass
    return found


def check_rank_env(expect, tf, tag):
    """env.cpu_threads[tag], run by every rank: the manifest's cpu_env values and the expected
    OMP_NUM_THREADS are what this rank's process has; oneDNN is on here too."""
    name = "env.cpu_threads" + tag
    want = dict(expect.get("cpu_env") or {})
    if not want:
        return result(name, SKIP, "manifest sets no CPU threading variables (GPU TensorFlow, or an "
                      "older manifest)")
    omp, source = expected_omp()
    seen = {k: os.environ.get(k) for k in sorted(want)}
    seen["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS")
    problems = []
    for k, v in sorted(want.items()):
        if seen[k] != str(v):
            problems.append("%s=%s, manifest/job.sbatch set %s" % (k, seen[k] if seen[k] is not None
                                                                   else "unset", v))
    if omp is not None and seen["OMP_NUM_THREADS"] != omp:
        problems.append("OMP_NUM_THREADS=%s, expected %s (%s)" % (seen["OMP_NUM_THREADS"] or "unset", omp,
                                                                   source))
    on, how = onednn_state(tf) if onednn_wanted(expect) else (None, "not asked")
    if onednn_wanted(expect) and not on:
        problems.append("oneDNN off in this rank (%s: %s)" % (how, on))
    intra = None
    try:
        intra = tf.config.threading.get_intra_op_parallelism_threads()
    except Exception:  # noqa: BLE001
        pass
    data = {"env": seen, "omp_expected": omp, "omp_source": source, "onednn": on,
            "intra_op_threads": intra, "openmp_runtimes": openmp_runtimes()}
    shown = " ".join("%s=%s" % (k, v) for k, v in sorted(seen.items()))
    if problems:
        return result(name, FAIL, "; ".join(problems) + " (this rank: %s)" % shown, figure="drifted",
                      data=data)
    omp_libs = data["openmp_runtimes"]
    return result(name, PASS, "%s as the manifest/job.sbatch set%s; oneDNN %s; TF intra-op threads %s; "
                  "OpenMP runtime loaded: %s" % (
                      shown, (" (OMP_NUM_THREADS from %s)" % source) if source else "",
                      "on" if on else "not asked", intra,
                      ", ".join(omp_libs) or "none (TensorFlow's own thread pool)"),
                  figure="OMP %s" % seen["OMP_NUM_THREADS"], data=data)
