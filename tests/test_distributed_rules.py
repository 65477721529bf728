"""`distributed`, `arch` and the site's `gpu` / `driver`: every rule refuses its spec with the rule
code, the reason and a fix (exit 2, no traceback), and the good specs pass. The job script's
torch launch modes and the GPU preflight, as bash reads them."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import RECIPES

CPU_DDP = (RECIPES / "cpu-torch-ddp.yaml").read_text()
GPU_DDP = (RECIPES / "gpu-torch-ddp.yaml").read_text()
ARM_DDP = (RECIPES / "gpu-torch-ddp-aarch64.yaml").read_text()
HVD_CU12 = (RECIPES / "gpu-torch-horovod-cu12.yaml").read_text()
CPU_HVD = (RECIPES / "cpu-torch-horovod.yaml").read_text()
TF_GPU = """\
name: tf
framework: {name: tensorflow, version: "2.21.0"}
python: "3.12"
cuda: {version: "12.8"}
"""


def edit(text: str, **changes: str) -> str:
    for old, new in changes.items():
        old = old.replace("__", " ")
        assert old in text, old
        text = text.replace(old, new)
    return text


def with_cluster(text: str, *lines: str) -> str:
    """Add keys to the spec's cluster section (site-profile keys: arch, gpu, driver)."""
    if "\ncluster:\n" not in text:
        text += "cluster:\n"
    return text.replace("\ncluster:\n", "\ncluster:\n" + "".join(f"  {x}\n" for x in lines), 1)


REFUSED = [
    # distributed
    ("horovod-without-section", CPU_DDP.replace("distributed: {kind: torch, backend: gloo, launcher: srun}",
                                                "distributed: {kind: horovod}"),
     ["DIST_HOROVOD_MISSING", "distributed.kind", "add horovod:"]),
    ("horovod-section-but-torch", CPU_HVD.replace("horovod: {", "distributed: {kind: torch}\nhorovod: {"),
     ["DIST_HOROVOD_EXTRA", "remove the horovod section"]),
    ("torch-option-on-none", CPU_DDP.replace("kind: torch, backend: gloo, launcher: srun", "kind: none, backend: gloo"),
     ["DIST_OPTION", "distributed.backend", "remove distributed.backend"]),
    ("torch-on-tensorflow", CPU_DDP.replace('{name: pytorch, version: "2.13.0+cpu"}',
                                            '{name: tensorflow-cpu, version: "2.15.1"}'),
     ["DIST_FRAMEWORK", "needs PyTorch", "tf-multiworker"]),
    ("multiworker-on-torch", CPU_DDP.replace("kind: torch, backend: gloo, launcher: srun", "kind: tf-multiworker"),
     ["DIST_FRAMEWORK", "needs TensorFlow", "use kind: torch"]),
    ("nccl-on-cpu", CPU_DDP.replace("backend: gloo", "backend: nccl"),
     ["DIST_NCCL_CPU", "needs GPUs", "backend: gloo"]),
    ("mpi-backend", CPU_DDP.replace("backend: gloo", "backend: mpi"),
     ["DIST_MPI_BACKEND", "no MPI backend", "use backend: nccl (GPUs) or gloo"]),
    # arch
    ("spec-and-site-arch-differ", with_cluster(CPU_DDP.replace("python:", "arch: aarch64\npython:"), "arch: x86_64"),
     ["ARCH_SITE", "the site's nodes are x86_64", "set arch: x86_64"]),
    ("grace-gpu-on-x86", with_cluster(GPU_DDP, "gpu: gh200"),
     ["ARCH_GPU", "aarch64 CPUs (Grace)", "set arch: aarch64"]),
    ("tensorflow-gpu-on-aarch64", TF_GPU + "arch: aarch64\n",
     ["ARCH_TF_GPU", "no aarch64 GPU wheels"]),
    ("pytorch-image-on-aarch64", ARM_DDP.replace("arch: aarch64", "arch: aarch64\nbase: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel\nbase_os: ubuntu22.04"),
     ["ARCH_BASE", "no arm64 image"]),
    ("aarch64-torch-from-pypi", ARM_DDP.replace('version: "2.15.0"}', 'version: "2.10.0", index_url: "https://pypi.org/simple"}'),
     ["ARCH_TORCH_INDEX", "2.10.0 is a CPU build", "download.pytorch.org"]),
    # the site's GPU
    ("unknown-gpu-model", with_cluster(GPU_DDP, "gpu: k80x"),
     ["GPU_UNKNOWN", "'k80x'", 'gpu: "9.0"']),
    ("cuda13-on-volta", with_cluster(GPU_DDP, "gpu: v100"),
     ["CUDA_ARCH", "compute capability < 7.5", "use CUDA 12.x"]),
    ("blackwell-on-cuda12", with_cluster(HVD_CU12, "gpu: b200"),
     ["CUDA_BLACKWELL", "Blackwell needs CUDA >= 12.8"]),
    ("arch-list-misses-the-gpu", with_cluster(ARM_DDP.replace("gpu: gh200", 'gpu: "7.5"'), ),
     ["WHEEL_ARCH", "sm_80, sm_90, sm_100, sm_110, sm_120 + PTX", "no code for compute capability 7.5"]),
    ("tensorflow-on-blackwell", with_cluster(TF_GPU, "gpu: b200"),
     ["WHEEL_ARCH", "XLA cannot JIT", "PyTorch with CUDA >= 12.8"]),
    # the site's driver
    ("driver-too-old-for-cuda13", with_cluster(GPU_DDP, "gpu: h100", 'driver: "570.124.06"'),
     ["DRIVER_MIN", ">= 580.65.06", "cuda-compat-13-2"]),
    ("forward-compat-on-a-consumer-gpu",
     with_cluster(GPU_DDP.replace('pip: ["tensorboard==2.20.0"]', 'pip: ["tensorboard==2.20.0"]\n  apt: [cuda-compat-13-2]'),
                  "gpu: rtx-5090", 'driver: "570.124.06"'),
     ["FWD_COMPAT_GPU", "data-centre GPUs only", "driver >= 580.65.06"]),
    # the schema
    ("unknown-kind", CPU_DDP.replace("kind: torch", "kind: deepspeed"),
     ["distributed.kind", "'deepspeed' is not one of horovod, torch, tf-multiworker, none"]),
    ("driver-not-a-version", with_cluster(GPU_DDP, "driver: latest"),
     ["cluster.driver", "'latest' is not valid here", "a driver version like 580.65.06"]),
    ("arm64-spelling", CPU_DDP.replace("python:", "arch: arm64\npython:"),
     ["arch", "'arm64' is not one of x86_64, aarch64"]),
]


@pytest.mark.parametrize("name,text,needles", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_with_code_reason_and_fix(cli, write_spec, name, text, needles):
    r = cli("check", str(write_spec(text)))
    assert r.code == 2, (name, r.out, r.err)
    assert "Traceback" not in r.err
    for n in needles:
        assert n in r.err, (n, r.err)


ACCEPTED = [
    ("cpu-ddp-preset", CPU_DDP, []),
    ("gpu-ddp-on-h100-with-a-cuda13-driver", with_cluster(GPU_DDP, "gpu: h100", 'driver: "580.65.06"'), []),
    ("gpu-ddp-by-compute-capability", with_cluster(GPU_DDP, 'gpu: "12.0"'), []),
    ("forward-compat-on-a-data-centre-gpu",
     with_cluster(GPU_DDP.replace('pip: ["tensorboard==2.20.0"]', 'pip: ["tensorboard==2.20.0"]\n  apt: [cuda-compat-13-2]'),
                  "gpu: h100", 'driver: "570.124.06"'),
     ["the image's cuda-compat runs it"]),
    ("gloo-on-gpus-warns", GPU_DDP.replace("backend: nccl", "backend: gloo"), ["moves every gradient through host memory"]),
    ("aarch64-preset-on-gh200", ARM_DDP, []),
    ("horovod-spec-unchanged", CPU_HVD, []),
    ("cu12-horovod-on-a100", with_cluster(HVD_CU12, "gpu: a100", 'driver: "560.35.05"'), []),
]


@pytest.mark.parametrize("name,text,warnings", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted(cli, write_spec, name, text, warnings):
    r = cli("check", str(write_spec(text)))
    assert r.code == 0, (name, r.err)
    assert ": ok (" in r.out
    for w in warnings:
        assert w in r.err, r.err


def test_a_site_profile_brings_arch_gpu_and_driver(cli, write_spec, tmp_path):
    site = tmp_path / "old-driver.yaml"
    site.write_text('name: old-driver\npartition: gpu\ngpus_per_node: 4\ngpu: h100\ndriver: "570.124.06"\n'
                    "arch: x86_64\n")
    spec = write_spec(GPU_DDP)
    assert cli("check", str(spec)).code == 0
    r = cli("check", str(spec), "--site", str(site))
    assert r.code == 2 and "DRIVER_MIN" in r.err and "cluster.driver" in r.err, r.err
    r = cli("build", str(spec), "--no-build", "--site", str(site), "--out", str(tmp_path / "o"))
    assert r.code == 2 and "DRIVER_MIN" in r.err
    assert not (tmp_path / "o").exists()           # refused before anything is written


def test_a_horovod_spec_keeps_its_hash_and_manifest(cli, tmp_path):
    """Specs that only name horovod: no `distributed` in the canonical form or the manifest."""
    import json

    r = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(tmp_path / "o"))
    assert r.code == 0, r.err
    man = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert "distributed" not in man["expect"] and "distributed" not in man["spec"]
    committed = json.loads((RECIPES.parent / "images" / "cpu-torch-horovod" / "manifest.json").read_text())
    assert man["spec_sha256"] == committed["spec_sha256"]


# --- the job script ------------------------------------------------------------------------------

def render(cli, write_spec, tmp_path, text: str) -> str:
    out = tmp_path / "o"
    r = cli("build", str(write_spec(text)), "--no-build", "--out", str(out))
    assert r.code == 0, r.err
    script = out / "job.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    return script.read_text()


def test_srun_mode_sets_the_rank_variables_inside_the_step(cli, write_spec, tmp_path):
    text = render(cli, write_spec, tmp_path, CPU_DDP)
    assert "#SBATCH --ntasks-per-node=2" in text
    start = text.index("rank_main() {")
    body = text[start:text.index("\n}\n", start)]
    assert 'export RANK="${SLURM_PROCID:-0}" LOCAL_RANK="${SLURM_LOCALID:-0}" WORLD_SIZE="${SLURM_NTASKS:-1}"' in body
    assert "LOCAL_WORLD_SIZE=" in body
    assert re.search(r"srun --mpi=none --kill-on-bad-exit=1 .*\n.*bash -c 'rank_main", text)
    assert "export MASTER_ADDR MASTER_PORT=" in text
    assert "torch.distributed.run" not in text


def test_torchrun_mode_one_task_per_node_with_a_c10d_rendezvous(cli, write_spec, tmp_path):
    text = render(cli, write_spec, tmp_path, CPU_DDP.replace("launcher: srun", "launcher: torchrun"))
    assert "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --cpus-per-task=2" in text
    assert 'RANKS_PER_NODE="${ENVBUILDER_RANKS_PER_NODE:-2}"' in text
    run_ranks = text[text.index("run_ranks() {"):]
    for piece in ('--nnodes="${SLURM_JOB_NUM_NODES:-1}"', '--nproc_per_node="$RANKS_PER_NODE"',
                  "--rdzv_backend=c10d", '--rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT"',
                  '--rdzv_id="${SLURM_JOB_ID:-0}"'):
        assert piece in run_ranks, piece
    assert "--ntasks-per-node=1" in text[text.index("run_nodes() {"):]
    assert "--launcher torchrun" in text          # the smoke suite starts torchrun itself


PREFLIGHT = r"""
set -u
note() { echo "envbuilder: $*" >&2; }
die() { echo "envbuilder: error: $*" >&2; exit 2; }
%s
%s
"""


def _functions(text: str) -> str:
    start = text.index("version_lt() {")
    end = text.index("\n}\n", text.index("gpu_preflight() {")) + 3
    return text[start:end]


def test_gpu_preflight_knows_the_image_and_skips_without_nvidia_smi(cli, write_spec, tmp_path):
    text = render(cli, write_spec, tmp_path, GPU_DDP)
    fns = _functions(text)
    assert "floor=580.65.06" in fns and "archs='7.5 8.0 8.6 9.0 10.0 12.0'" in fns and "ptx=12.0" in fns
    assert "    gpu_preflight" in text[text.index("node_setup() {"):]
    # this machine has no GPU and no nvidia-smi: the preflight says so and lets the job go on
    proc = subprocess.run(["bash", "-c", PREFLIGHT % (fns, "gpu_preflight")], capture_output=True, text=True,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "no nvidia-smi on the node: driver and GPU not checked" in proc.stderr
    # the comparison it relies on, as this bash runs it
    checks = ("version_lt 570.124.06 580.65.06 && echo lt; version_lt 580.65.06 580.65.06 || echo eq; "
              "version_lt 590.44.01 580.65.06 || echo ge; version_lt 9.0 12.0 && echo lt2")
    proc = subprocess.run(["bash", "-c", PREFLIGHT % (fns, checks)], capture_output=True, text=True)
    assert proc.stdout.split() == ["lt", "eq", "ge", "lt2"], proc.stdout + proc.stderr


def test_cpu_stacks_have_no_gpu_preflight(cli, write_spec, tmp_path):
    assert "gpu_preflight" not in render(cli, write_spec, tmp_path, CPU_DDP)
