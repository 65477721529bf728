"""job.sbatch for every runtime and option, checked without a cluster: shellcheck finds nothing,
the apptainer and pyxis variants (which cannot run here) carry the right launch line, and site
profiles, sweeps, staging and monitoring show up where a user looks for them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import RECIPES, ROOT, run_envbuilder_in_process

RUNTIMES = ("apptainer", "singularity", "charliecloud", "pyxis", "host")

EVERYTHING = """\
name: all-options
framework: {name: pytorch, version: "2.0.1"}
python: "3.10"
cuda: {version: "11.8", cudnn: "8", nccl: "2.15.5"}
mpi: {flavor: openmpi, version: "4.1.5", pmi: pmix}
horovod: {version: "0.28.1", operations: [nccl, mpi, gloo]}
cluster:
  nodes: 2
  gpus_per_node: 4
  cpus_per_task: 8
  binds: ["/data/my set:/data:ro", "/scratch/it's here"]
  network_interface: ib0
  env: {NCCL_IB_HCA: mlx5}
  modules: [cuda/11.8, "openmpi/4.1.5"]
  venv: /opt/venvs/torch
  stage: /scratch/datasets/cifar
  local_scratch: /local/ssd
  monitor: [tensorboard, timeline]
  sweep: ["lr=0.1,0.01", "batch=32,64,128"]
  command: python train.py --lr "$LR" --batch "$BATCH"
"""


def render(tmp_path: Path, spec: Path, *args: str) -> str:
    """job.sbatch as `envbuilder build --no-build` writes it (in this process: most tests here
    render several, and a new interpreter per render was most of this module's time)."""
    out = tmp_path / ("out-" + "-".join(a.strip("-").replace("/", "_") for a in args))
    r = run_envbuilder_in_process("build", str(spec), "--no-build", "--out", str(out), *args)
    assert r.code == 0, r.err
    return (out / "job.sbatch").read_text()


def shellcheck(text: str, tmp_path: Path) -> str:
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck must be installed (.ci/install-system.sh)"
    path = tmp_path / "check.sbatch"
    path.write_text(text)
    proc = subprocess.run([exe, "--shell=bash", "--severity=style", str(path)], capture_output=True, text=True)
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_runtime_with_every_option_passes_shellcheck(write_spec, tmp_path, runtime):
    text = render(tmp_path, write_spec(EVERYTHING), "--runtime", runtime)
    assert shellcheck(text, tmp_path) == ""
    plain = render(tmp_path, RECIPES / "cpu-torch-horovod.yaml", "--runtime", runtime)
    assert shellcheck(plain, tmp_path) == ""


def test_apptainer_runs_each_rank_in_the_image_with_gpus_and_checked_binds(write_spec, tmp_path):
    text = render(tmp_path, write_spec(EVERYTHING), "--runtime", "apptainer")
    assert 'launch=(apptainer exec --nv --home "$HOME" "${runtime_args[@]}" "$IMAGE")' in text
    assert 'runtime_args+=(--bind "$b")' in text
    assert "srun --mpi=pmix --kill-on-bad-exit=1 --gpu-bind=none" in text
    # never --cleanenv/--containall on the command line; set in the environment, the job stops
    # before any rank naming it (real Apptainer: tests/test_apptainer_jobs.py)
    assert [line for line in text.splitlines() if " exec " in line and ("--cleanenv" in line or "--containall" in line)
            and not line.lstrip().startswith("#")] == []
    assert "for v in APPTAINER_CLEANENV APPTAINER_CONTAINALL SINGULARITY_CLEANENV SINGULARITY_CONTAINALL; do" in text
    # bind sources with spaces and quotes are quoted once, for the shell
    assert "add_bind '/data/my set:/data:ro' cluster.binds" in text
    assert "add_bind '/scratch/it'\"'\"'s here' cluster.binds" in text
    singularity = render(tmp_path, write_spec(EVERYTHING), "--runtime", "singularity")
    assert "launch=(singularity exec --nv" in singularity


def test_pyxis_hands_the_image_and_mounts_to_srun(write_spec, tmp_path):
    text = render(tmp_path, write_spec(EVERYTHING), "--runtime", "pyxis")
    assert '--container-image="$IMAGE" --container-mounts="$mounts" --no-container-mount-home' in text
    assert 'srun --mpi=pmix --kill-on-bad-exit=1 --gpu-bind=none "${runtime_args[@]}"' in text
    assert "launch=()" in text


def test_environment_hygiene_threads_and_network(write_spec, tmp_path):
    text = render(tmp_path, write_spec(EVERYTHING), "--runtime", "apptainer")
    for line in ('export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"',
                 'export OMP_NUM_THREADS="$SRUN_CPUS_PER_TASK"',
                 "export PYTHONNOUSERSITE=1 LC_ALL=C.UTF-8 LANG=C.UTF-8",
                 'export HOME="$JOB_LOCAL/home"',
                 'export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-ib0}"',
                 'export GLOO_SOCKET_IFNAME="$NCCL_SOCKET_IFNAME"',
                 "export NCCL_IB_HCA=mlx5",
                 'LOCAL_ROOT="${ENVBUILDER_LOCAL:-/local/ssd}"',
                 "#SBATCH --cpus-per-task=8"):
        assert line in text, line
    # rank 0 alone keeps the checkpoint / TensorBoard folders
    assert 'if [ "$RANK" != 0 ]; then unset CHECKPOINT_DIR TENSORBOARD_DIR; fi' in text
    intel = render(tmp_path, RECIPES / "intel-tf-cpu.yaml")
    assert "KMP_AFFINITY=granularity=fine,compact,1,0" in intel and "TF_ENABLE_ONEDNN_OPTS=1" in intel


def test_sweep_becomes_a_job_array_with_values_and_folders(write_spec, tmp_path):
    text = render(tmp_path, write_spec(EVERYTHING), "--runtime", "host")
    assert "#SBATCH --array=0-5" in text and "#SBATCH --output=%x-%A_%a.out" in text
    assert "    0) BATCH=32 LR=0.1 ;;" in text and "    5) BATCH=128 LR=0.01 ;;" in text
    assert "export BATCH LR" in text
    assert "task-${SLURM_ARRAY_TASK_ID:-0}" in text
    # the command line replaces a name of the spec's grid and adds new ones
    over = render(tmp_path, write_spec(EVERYTHING), "--sweep", "lr=1e-3", "--sweep", "seed=1,2")
    assert "#SBATCH --array=0-5" in over and "    5) BATCH=128 LR=1e-3 SEED=2 ;;" in over


def test_staging_and_monitoring_lines(write_spec, tmp_path):
    text = render(tmp_path, write_spec(EVERYTHING), "--runtime", "charliecloud")
    assert "STAGE_SRC=/scratch/datasets/cifar" in text
    assert 'ENVBUILDER_DATA="$JOB_LOCAL/data/$(basename "$STAGE_SRC")"' in text
    assert "stage_data() {" in text and '--ntasks-per-node=1 --ntasks="${SLURM_JOB_NUM_NODES:-1}" --mpi=none bash -c node_step' in text
    assert 'if [ "${ENVBUILDER_TENSORBOARD:-1}" = 1 ]' in text
    assert "ssh -N -L $TB_PORT:127.0.0.1:$TB_PORT -J" in text
    assert "--host 127.0.0.1" in text
    assert 'HOROVOD_TIMELINE="$OUTPUT_DIR/horovod-timeline.json"' in text
    plain = render(tmp_path, RECIPES / "cpu-torch-horovod.yaml")
    assert 'if [ "${ENVBUILDER_TENSORBOARD:-0}" = 1 ]' in plain and "stage_data" not in plain


def test_same_spec_gives_a_byte_identical_job_script(write_spec, tmp_path):
    spec = write_spec(EVERYTHING)
    a = render(tmp_path / "a", spec, "--site", "example-gpu")
    b = render(tmp_path / "b", spec, "--site", "example-gpu")
    assert a == b


def test_a_site_profile_sets_the_cluster_and_adds_binds(write_spec, tmp_path):
    text = render(tmp_path, RECIPES / "tf-horovod-gpu.yaml", "--site", "example-gpu")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=proj123", "#SBATCH --cpus-per-task=16",
                 "#SBATCH --mem-per-cpu=4G", "add_bind /scratch cluster.binds",
                 "add_bind /projects cluster.binds", "export NCCL_IB_HCA=mlx5",
                 "# Slurm job for tf-horovod-gpu (apptainer runtime)"):
        assert line in text, line
    local = render(tmp_path, RECIPES / "tf-horovod-gpu.yaml", "--site", str(ROOT / "sites" / "local.yaml"))
    assert "#SBATCH --partition=debug" in local and "(charliecloud runtime)" in local
    # --runtime wins over the site
    assert "(host runtime)" in render(tmp_path, RECIPES / "tf-horovod-gpu.yaml", "--site", "local", "--runtime", "host")


def test_the_gh200_slingshot_example_site_renders_the_aarch64_preset_with_its_sourced_settings(cli, write_spec,
                                                                                                tmp_path):
    """sites/example-gh200-slingshot.yaml: the GH200 preset takes it (aarch64, gh200, PMIx); job.sbatch
    exports the C2C/NVLink settings CSCS's images bake and the PMIx setting as the site's (fixed),
    the Slingshot fabric's cscs-docs defaults as defaults; an x86_64 spec is refused (ARCH_SITE)."""
    text = render(tmp_path, RECIPES / "gpu-torch-ddp-aarch64.yaml", "--site", "example-gh200-slingshot")
    for line in ("export NCCL_NET_GDR_C2C=1", "export NCCL_P2P_LEVEL=NVL", "export NCCL_PXN_DISABLE=1",
                 "export PMIX_MCA_psec=native", 'export FI_PROVIDER="${FI_PROVIDER:-cxi}"',
                 'export NCCL_NET="${NCCL_NET:-AWS Libfabric}"',
                 "#SBATCH --cpus-per-task=288"):       # torchrun: one task per node, 4 ranks x 72 cores
        assert line in text, line
    x86 = write_spec((RECIPES / "cpu-torch-ddp.yaml").read_text().replace("python:", "arch: x86_64\npython:", 1))
    r = cli("build", str(x86), "--no-build", "--out", str(tmp_path / "x86"), "--site", "example-gh200-slingshot")
    assert r.code == 2 and "ARCH_SITE" in r.err and "the site's nodes are aarch64" in r.err, r.err
    assert not (tmp_path / "x86").exists()


def test_bad_site_and_sweep_input_get_one_message_and_exit_2(cli, write_spec, tmp_path):
    r = cli("build", str(RECIPES / "tf-horovod-gpu.yaml"), "--no-build", "--out", str(tmp_path / "x"), "--site", "nowhere")
    assert r.code == 2 and "no site profile named 'nowhere'" in r.err and "example-gpu" in r.err
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\npartition: gpu\ngpus_per_nod: 4\n")
    r = cli("build", str(RECIPES / "tf-horovod-gpu.yaml"), "--no-build", "--out", str(tmp_path / "x"), "--site", str(bad))
    assert r.code == 2 and "bad.yaml:3: gpus_per_nod: unknown key" in r.err and "gpus_per_node" in r.err
    r = cli("build", str(RECIPES / "tf-horovod-gpu.yaml"), "--no-build", "--out", str(tmp_path / "x"), "--sweep", "lr")
    assert r.code == 2 and "'lr' is not NAME=value1,value2" in r.err
    r = cli("check", str(write_spec(EVERYTHING.replace('"lr=0.1,0.01"', '"lr 0.1"'))))
    assert r.code == 2 and "cluster.sweep[0]" in r.err
    assert not (tmp_path / "x").exists()


def test_the_spec_hash_of_existing_specs_is_unchanged_by_the_new_keys(tmp_path):
    """Image tags derive from the spec hash: adding cluster keys must not retag every image.
    (141fef067edc: cpu-torch's hash when its base was the full local/debian:bookworm.)"""
    from envbuilder.spec.model import load_spec

    old = tmp_path / "cpu-torch-horovod.yaml"
    old.write_text((RECIPES / "cpu-torch-horovod.yaml").read_text().replace("base: debian:bookworm-slim",
                                                                    "base: local/debian:bookworm"))
    assert load_spec(old).sha256().startswith("141fef067edc")


def site_file(tmp_path: Path, **keys: str) -> Path:
    path = tmp_path / f"site-{'-'.join(keys.values()).replace('/', '_')}.yaml"
    path.write_text("name: test-site\npartition: mc\n" + "".join(f"{k}: {v}\n" for k, v in keys.items()))
    return path


def task_epilog_of(job: str) -> str:
    start = job.index("<<'ENVBUILDER_TASK_EPILOG'\n") + len("<<'ENVBUILDER_TASK_EPILOG'\n")
    return job[start:job.index("\nENVBUILDER_TASK_EPILOG\n", start) + 1]


def test_the_task_epilog_removes_only_this_jobs_marked_or_emptied_folder(write_spec, tmp_path):
    """The file job.sbatch writes for `srun --task-epilog`, run by bash as slurmstepd runs it (no
    arguments, the step's environment): a marked folder goes whatever is in it; one a cut-short
    removal left empty goes; an unmarked folder with content, a link, a name that is not a job's
    folder are left; the job's PATH is not used."""
    job = render(tmp_path, write_spec(EVERYTHING), "--runtime", "host")
    epilog = tmp_path / "epilog"
    epilog.write_text(task_epilog_of(job))
    epilog.chmod(0o700)
    root = tmp_path / "local"
    trap = tmp_path / "trap-bin"          # an rm on the job's PATH that would leave everything
    trap.mkdir()
    (trap / "rm").write_text("#!/bin/sh\nexit 0\n")
    (trap / "rm").chmod(0o755)

    def run(folder: Path) -> None:
        env = {"JOB_LOCAL": str(folder), "PATH": f"{trap}:/usr/bin:/bin", "SLURM_JOB_ID": folder.name.split(".")[-1]}
        proc = subprocess.run([str(epilog)], env=env, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr

    marked = root / "envbuilder.11"
    (marked / "home" / ".cache").mkdir(parents=True)
    (marked / "data" / "x.bin").parent.mkdir()
    (marked / "data" / "x.bin").write_bytes(b"x" * 1000)
    (marked / ".envbuilder-job").write_text("11\n")
    run(marked)
    assert not marked.exists()
    emptied = root / "envbuilder.12"
    emptied.mkdir()
    run(emptied)
    assert not emptied.exists()
    unmarked = root / "envbuilder.13"
    (unmarked / "keep").mkdir(parents=True)
    run(unmarked)
    assert (unmarked / "keep").is_dir()
    victim = tmp_path / "victim"
    (victim / "keep").mkdir(parents=True)
    (victim / ".envbuilder-job").write_text("14\n")
    link = root / "envbuilder.14"
    link.symlink_to(victim)
    run(link)
    assert link.is_symlink() and (victim / "keep").is_dir()
    other = root / "mine"
    (other / "keep").mkdir(parents=True)
    (other / ".envbuilder-job").write_text("15\n")
    run(other)
    assert (other / "keep").is_dir()


def test_who_removes_the_node_local_folder_follows_the_site_profile(cli, write_spec, tmp_path):
    spec = write_spec(EVERYTHING)
    # job (default): one step per node keeps the folder and removes it; the batch script traps
    # TERM/INT/HUP and cleans its own node; stale folders of ended jobs are swept
    job = render(tmp_path, spec, "--runtime", "host")
    for line in ("trap \"trap '' USR1 TERM INT HUP; remove_job_local; exit 0\" USR1 TERM INT HUP",
                 "trap 'exit 143' TERM", "trap cleanup EXIT", "    trap '' TERM INT HUP",
                 'srun --overlap --kill-on-bad-exit=0 --task-epilog="$node_epilog" --ntasks-per-node=1',
                 "bash -c node_step > \"$node_fifo\" &", "    sweep_stale || true",
                 'if state=$(squeue -h -t all -j "$id" -o %T 2>&1); then',
                 '    printf \'%s\\n\' "${SLURM_JOB_ID:-$$}" > "$JOB_LOCAL/.envbuilder-job"'):
        assert line in job, line
    # the trap is set before the folder is made, in the step and in the batch script
    step = job[job.index("node_step() {"):]
    assert step.index("remove_job_local; exit 0") < step.index("(make_job_local)")
    # the cleanup ignores further signals first (one must not cut it short)
    clean = job[job.index("cleanup() {"):]
    assert clean.index("trap '' TERM INT HUP") < clean.index("remove_job_local")
    assert job.index("trap cleanup EXIT") < job.index("\nmake_job_local\n")
    # slurm: the site's per-job folder; job.sbatch removes nothing itself and keeps no step
    slurm = render(tmp_path, spec, "--runtime", "host", "--site", str(site_file(tmp_path, local_cleanup="slurm")))
    assert "remove_job_local" not in slurm and "sweep_stale" not in slurm
    assert "keeper_pid" not in slurm and "--overlap --kill-on-bad-exit=0" not in slurm and "task-epilog" not in slurm
    assert 'srun --ntasks-per-node=1 --ntasks="${SLURM_JOB_NUM_NODES:-1}" --mpi=none bash -c node_step' in slurm
    assert 'LOCAL_ROOT="${ENVBUILDER_LOCAL:-/local/ssd}"' in slurm
    # epilog: the same, and slurm-epilog.sh beside job.sbatch, for the site's local root
    out = tmp_path / "epi"
    r = cli("build", str(spec), "--no-build", "--out", str(out), "--runtime", "charliecloud",
            "--site", str(site_file(tmp_path, local_cleanup="epilog", local_scratch="/scratch/local")))
    assert r.code == 0, r.err
    epilog = out / "slurm-epilog.sh"
    assert epilog.stat().st_mode & 0o111 and "ROOTS=(/scratch/local)\n" in epilog.read_text()
    assert "Written by envbuilder" in epilog.read_text()
    assert "sweep_stale" not in (out / "job.sbatch").read_text()
    assert not (tmp_path / "out---runtime-host" / "slurm-epilog.sh").exists()
    for text in (job, slurm, (out / "job.sbatch").read_text()):
        assert shellcheck(text, tmp_path) == ""
    assert shellcheck(epilog.read_text(), tmp_path) == ""
    bad = cli("build", str(spec), "--no-build", "--out", str(tmp_path / "x"),
              "--site", str(site_file(tmp_path, local_cleanup="never")))
    assert bad.code == 2 and "local_cleanup" in bad.err


def test_the_node_epilog_removes_only_the_jobs_marked_folder(tmp_path):
    """The Epilog slurmd runs as root: a real folder with the marker goes; a link (and what it
    points at), an unmarked folder, another job's folder, a job id that is not a number stay."""
    from envbuilder.render.sbatch_sections.nodelocal import epilog_text

    root = tmp_path / "local"
    root.mkdir()
    script = tmp_path / "epilog.sh"
    script.write_text(epilog_text(str(root)))

    def run(job_id: str) -> int:
        env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(os.getuid()), "PATH": "/usr/bin:/bin"}
        return subprocess.run(["bash", str(script)], env=env, capture_output=True).returncode

    def folder(name: str, marked: bool = True) -> Path:
        d = root / name
        (d / "data" / "sub").mkdir(parents=True)
        (d / "data" / "sub" / "f").write_text("x")
        (d / "data" / "*").write_text("a file named *")
        if marked:
            (d / ".envbuilder-job").write_text(name.split(".")[-1] + "\n")
        return d

    mine, other, unmarked = folder("envbuilder.101"), folder("envbuilder.102"), folder("envbuilder.103", False)
    victim = folder("victim")
    (root / "envbuilder.104").symlink_to(victim)
    (mine / "data" / "link").symlink_to(victim)            # a link inside: removed, not followed
    assert [run(i) for i in ("101", "102x", "*", "", "103", "104")] == [0] * 6
    assert not mine.exists() and other.exists() and unmarked.exists()
    assert (root / "envbuilder.104").is_symlink() and (victim / "data" / "sub" / "f").is_file()
    # another user's folder of that job id is not the job's
    wrong_uid = {"SLURM_JOB_ID": "102", "SLURM_JOB_UID": str(os.getuid() + 1), "PATH": "/usr/bin:/bin"}
    assert subprocess.run(["bash", str(script)], env=wrong_uid).returncode == 0 and other.exists()


VETTED = """\
name: vetted
framework: {name: pytorch, version: "2.13.0+cpu"}
python: "3.11"
base: local/debian:bookworm-slim
distributed: {kind: torch, launcher: LAUNCHER}
cluster: {nodes: 4, ntasks_per_node: 2, runtime: charliecloud, vet_min_nodes: 3}
"""


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_node_vetting_is_rendered_only_when_asked_and_reaches_the_ranks_step(write_spec, tmp_path, launcher):
    plain = render(tmp_path, write_spec(VETTED.replace(", vet_min_nodes: 3", "").replace("LAUNCHER", launcher)))
    assert "envbuilder_smoke.vet" not in plain and "rank_opts" not in plain and "RANK_NODES" not in plain
    job = render(tmp_path, write_spec(VETTED.replace("LAUNCHER", launcher)), "--runtime", "charliecloud")
    assert 'VET_MIN_NODES="${ENVBUILDER_VET_MIN_NODES:-3}"' in job
    assert '"${launch[@]}" python -m envbuilder_smoke.vet --local-ranks "$per_node"' in job
    # vetting runs after every node's set-up and before the ranks; the ranks' srun takes its options
    assert job.index("vet_nodes; fi") > job.index("bash -c node_step") and job.index("vet_nodes; fi") < job.rindex("run_ranks")
    srun_line = "run_nodes() {" if launcher == "torchrun" else "run_ranks() {"
    step = job[job.index(srun_line):]
    assert '${rank_opts[@]+"${rank_opts[@]}"}' in step[:step.index("\n}\n")]
    if launcher == "torchrun":
        assert '--nnodes="${RANK_NODES:-${SLURM_JOB_NUM_NODES:-1}}"' in job and '--ntasks="$(( n * 1 ))"' in job
    else:
        assert "RANK_NODES" not in job and '--ntasks="$(( n * per_node ))"' in job
    if shutil.which("shellcheck"):
        assert shellcheck(job, tmp_path) == ""


def test_pmix_modules_every_client_has_are_chosen_in_the_image_only_under_pmix(tmp_path):
    """srun --mpi=pmix: of the modules Slurm's PMIx server offers, the client in the container gets
    native (psec) and hash (gds), never a list with munge it may lack; a value the image set is
    kept; not for the host runtime, nor a stack launched with another plugin. Run by bash."""
    lines = ('    if [ -z "${PMIX_MCA_psec:-}" ]; then case ",${PMIX_SECURITY_MODE:-}," in *,native,*) export PMIX_MCA_psec=native ;; esac; fi',
             '    if [ -z "${PMIX_MCA_gds:-}" ]; then case ",${PMIX_GDS_MODULE:-}," in *,hash,*) export PMIX_MCA_gds=hash ;; esac; fi')
    ch = render(tmp_path, RECIPES / "cpu-torch-horovod.yaml", "--runtime", "charliecloud")
    assert "srun --mpi=pmix" in ch
    rank_main = ch[ch.index("rank_main() {"):ch.index('    exec "$@"', ch.index("rank_main() {"))]
    assert all(line in rank_main for line in lines)
    assert "PMIX_SECURITY_MODE" not in render(tmp_path, RECIPES / "cpu-torch-horovod.yaml", "--runtime", "host")
    assert "PMIX_SECURITY_MODE" not in render(tmp_path, RECIPES / "cpu-torch-ddp.yaml", "--runtime", "charliecloud")
    script = "\n".join(line.strip() for line in lines) + '\necho "${PMIX_MCA_psec:-unset} ${PMIX_MCA_gds:-unset}"\n'

    def run(**env):
        return subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                              text=True, timeout=30).stdout.strip()
    assert run(PMIX_SECURITY_MODE="munge,native", PMIX_GDS_MODULE="ds21,ds12,hash") == "native hash"
    assert run(PMIX_SECURITY_MODE="munge", PMIX_GDS_MODULE="ds21") == "unset unset"
    assert run(PMIX_SECURITY_MODE="native", PMIX_MCA_psec="none", PMIX_GDS_MODULE="hash", PMIX_MCA_gds="ds12") == "none ds12"
    assert run() == "unset unset"


@pytest.mark.parametrize("runtime,var,value,stops", [
    ("apptainer", "APPTAINER_CLEANENV", "1", True),
    ("apptainer", "APPTAINER_CONTAINALL", "true", True),
    ("singularity", "SINGULARITY_CLEANENV", "yes", True),
    ("apptainer", "APPTAINER_CLEANENV", "0", False),
    ("apptainer", "APPTAINER_CLEANENV", "", False),
])
def test_a_cleanenv_or_containall_in_the_environment_stops_the_job_before_any_srun(tmp_path, runtime, var, value,
                                                                                  stops):
    """Apptainer reads --cleanenv/--containall from APPTAINER_* (and SINGULARITY_*) variables too;
    with either every rank is rank 0 of 1 (real Apptainer on 2 nodes: tests/test_apptainer_jobs.py).
    job.sbatch, run with a stub srun that records each call: such a variable stops it with exit 2
    naming it and the fix, before any srun; a false or empty value does not."""
    job = tmp_path / "job"
    r = run_envbuilder_in_process("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(job),
                                  "--runtime", runtime)
    assert r.code == 0, r.err
    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "srun-calls"
    (stubs / "srun").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (stubs / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    image = tmp_path / "x.sif"
    image.write_bytes(b"")
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "ENVBUILDER_DIR": str(job),
           "ENVBUILDER_IMAGE": str(image), "ENVBUILDER_LOCAL": str(tmp_path / "local"), var: value}
    proc = subprocess.run(["bash", str(job / "job.sbatch"), "python", "-c", "pass"], env=env, cwd=job,
                          capture_output=True, text=True, timeout=60)
    if stops:
        what = "--containall" if "CONTAINALL" in var else "--cleanenv"
        assert proc.returncode == 2, proc.stderr
        assert (f"envbuilder: error: {runtime}: {var}={value} is set: {what}" in proc.stderr
                and f"unset it for this job: env -u {var} sbatch job.sbatch" in proc.stderr), proc.stderr
        assert not calls.exists()
    else:         # past the check: the node set-up step is started (the stub then ends the job)
        assert calls.is_file() and "is set:" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("recipe,stops", [("gpu-torch-ddp-aarch64.yaml", True), ("cpu-torch-horovod.yaml", False)])
def test_a_node_of_another_architecture_than_the_images_stops_the_job_in_node_setup(tmp_path, recipe, stops):
    """node_setup (one task per node, before any rank) holds the node's `uname -m` against the
    image's arch. Run by bash on this x86_64 machine: the aarch64 preset's job stops with exit 2
    naming the node, both architectures and the fix; the x86_64 preset's passes that line."""
    job = tmp_path / "job"
    r = run_envbuilder_in_process("build", str(RECIPES / recipe), "--no-build", "--out", str(job))
    assert r.code == 0, r.err
    text = (job / "job.sbatch").read_text()
    lines = text.splitlines()
    fns = [ln for ln in lines if ln.startswith(("note() ", "die() "))]
    check = next(ln for ln in lines if 'uname -m)" =' in ln)
    proc = subprocess.run(["bash", "-c", "\n".join([*fns, check.strip(), "echo arch-ok"])],
                          capture_output=True, text=True, timeout=30)
    if stops:
        assert proc.returncode == 2 and "arch-ok" not in proc.stdout
        assert (f"envbuilder: error: node {os.uname().nodename} is x86_64, but the image is built for aarch64: "
                "ask for aarch64 nodes (--partition), or build the image with arch: x86_64") in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0 and "arch-ok" in proc.stdout, proc.stderr
    # the check runs inside node_setup, before the binds and the image are looked at
    setup = text[text.index("node_setup() {"):]
    assert setup.index('uname -m)" =') < setup.index('mkdir -p "$HOME"')


SITE_MPI_APPTAINER = """\
name: site-impi
partition: ac
pmi: pmi2
runtime: apptainer
site_mpi: [/opt/site/impi/lib]
site_mpi_abi: mpich
site_mpi_env: {FI_PROVIDER: tcp}
env: {OMPI_MCA_btl_vader_single_copy_mechanism: cma, ODD: 'a$HOME b\\c `d`'}
"""
MPICH_SPEC = """\
name: mpich-wheel
framework: {name: pytorch, version: "2.13.0+cpu"}
python: "3.11"
mpi: {flavor: mpich, version: "5.0.2", pmi: pmi2, source: pypi}
"""


def test_apptainer_hands_the_jobs_variables_and_the_site_mpi_over_as_apptainerenv(write_spec, tmp_path):
    """Apptainer keeps the image's value of a variable the image also sets: cluster.env and the
    site MPI's variables go in as APPTAINERENV_NAME (SINGULARITYENV_ for singularity), escaped
    for the second evaluation Apptainer gives them inside the container, and the site MPI's
    folders as APPTAINERENV_LD_LIBRARY_PATH ahead of the image's own path. Run with bash up to
    the launch: what each variable holds (real Apptainer: tests/test_apptainer_jobs.py)."""
    site = tmp_path / "site-impi.yaml"
    site.write_text(SITE_MPI_APPTAINER)
    spec = write_spec(MPICH_SPEC)
    text = render(tmp_path, spec, "--site", str(site))
    assert "image_vars=(ODD OMPI_MCA_btl_vader_single_copy_mechanism FI_PROVIDER)" in text
    assert 'APPTAINERENV_LD_LIBRARY_PATH="$(image_escape "$ENVBUILDER_SITE_MPI_PATH"):\\$LD_LIBRARY_PATH"' in text
    start = text.index("image_escape() {")
    block = text[start:text.index("\nimage_library_path\n", start)] + "\nimage_library_path\n"
    env_lines = "\n".join(line for line in text.splitlines() if line.startswith("export ")
                          and ("ODD" in line or "OMPI_MCA_btl_vader" in line or "FI_PROVIDER" in line))
    script = (f"{env_lines}\nENVBUILDER_SITE_MPI_PATH='/opt/site/impi/lib'\n{block}"
              "env | grep ^APPTAINERENV_ | sort\n")
    out = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "APPTAINERENV_FI_PROVIDER=tcp",
        "APPTAINERENV_LD_LIBRARY_PATH=/opt/site/impi/lib:$LD_LIBRARY_PATH",
        "APPTAINERENV_ODD=a\\$HOME b\\\\c \\`d\\`",
        "APPTAINERENV_OMPI_MCA_btl_vader_single_copy_mechanism=cma"], out.stdout
    singularity = render(tmp_path, spec, "--site", str(site), "--runtime", "singularity")
    assert 'export "SINGULARITYENV_$v=' in singularity and "export SINGULARITYENV_LD_LIBRARY_PATH" in singularity
    charliecloud = render(tmp_path, spec, "--site", str(site), "--runtime", "charliecloud")   # ch-run passes the host's
    assert "image_escape" not in charliecloud and "APPTAINERENV" not in charliecloud
    plain = render(tmp_path, RECIPES / "cpu-torch-horovod.yaml", "--runtime", "apptainer")           # nothing to hand over
    assert "image_escape" not in plain


def test_apptainer_stages_the_sif_to_each_node_when_asked(tmp_path):
    """ENVBUILDER_STAGE_IMAGE=1: the ranks start from a node-local copy of the .sif (node_setup makes
    it, node-local folder, same path on every node); the shared file's existence is what each node
    checks. Run with bash: the image variables as the launch sees them (real Apptainer:
    tests/test_apptainer_jobs.py, the scancel test)."""
    text = render(tmp_path, RECIPES / "cpu-torch-horovod.yaml", "--runtime", "apptainer")
    start = text.index("# The image staged (ENVBUILDER_STAGE_IMAGE=1)")
    block = text[start:text.index("\nfi\n", start) + 4]
    sif = tmp_path / "x.sif"
    sif.write_bytes(b"sif")
    script = f"IMAGE={sif}\nJOB_LOCAL=/local/envbuilder.7\n{block}echo \"$IMAGE ${{IMAGE_SRC:-none}}\"\n"
    for value, want in (("1", f"/local/envbuilder.7/image/x.sif {sif}"), ("0", f"{sif} none"), (None, f"{sif} none")):
        env = {"PATH": "/usr/bin:/bin", **({"ENVBUILDER_STAGE_IMAGE": value} if value else {})}
        out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == want, (value, out.stdout, out.stderr)
    assert text.index("    stage_image\n") > text.index('    local image=${IMAGE_SRC:-$IMAGE}')
    assert text.index("# The image staged") < text.index("launch=(apptainer exec")
    for runtime in ("charliecloud", "pyxis", "host"):
        assert "STAGE_IMAGE" not in render(tmp_path, RECIPES / "cpu-torch-horovod.yaml", "--runtime", runtime)


@pytest.mark.parametrize("site_mpi", [False, True])
def test_an_apptainerenv_library_path_set_before_the_job_is_kept_and_said(tmp_path, write_spec, site_mpi):
    """A site module's APPTAINERENV_LD_LIBRARY_PATH replaces the image's library path in every rank
    unless it names $LD_LIBRARY_PATH: job.sbatch says so (and keeps it after the site's MPI, which
    goes first). The job's function, run by bash with the variable set as a module would."""
    extra = "  site_mpi: [/opt/site/mpi/lib]\n  site_mpi_abi: mpich\n" if site_mpi else ""
    spec = write_spec("name: libpath\nframework: {name: pytorch, version: \"2.0.1\"}\npython: \"3.10\"\n"
                      "mpi: {flavor: mpich, version: \"4.1.2\", pmi: pmi2}\n"
                      f"cluster:\n  runtime: apptainer\n{extra}")
    job = render(tmp_path, spec)
    lines = job.splitlines()
    start = lines.index("image_library_path() {")
    body = lines[start:lines.index("}", start) + 1]
    fns = [ln for ln in lines if ln.startswith(("note() ", "die() "))]
    esc = (lines[lines.index("image_escape() {"):lines.index("}", lines.index("image_escape() {")) + 1]
           if site_mpi else [])

    def run(value: str | None) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "ENVBUILDER_SITE_MPI_PATH": "/opt/site/mpi/lib"}
        if value is not None:
            env["APPTAINERENV_LD_LIBRARY_PATH"] = value
        script = "\n".join([*fns, *esc, *body, "image_library_path", 'echo "out=${APPTAINERENV_LD_LIBRARY_PATH:-}"'])
        return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)

    plain = run(None)
    assert plain.returncode == 0 and plain.stderr == ""
    replaces = run("/opt/module/lib")
    assert ("APPTAINERENV_LD_LIBRARY_PATH is set (/opt/module/lib): it replaces the image's own library path "
            "in every rank; to keep the image's, end it with :\\$LD_LIBRARY_PATH") in replaces.stderr
    keeps = run("/opt/module/lib:$LD_LIBRARY_PATH")
    assert "kept for the ranks" in keeps.stderr and "replaces" not in keeps.stderr
    if site_mpi:
        assert plain.stdout.strip() == "out=/opt/site/mpi/lib:$LD_LIBRARY_PATH"
        assert replaces.stdout.strip() == "out=/opt/site/mpi/lib:/opt/module/lib"
    else:
        assert plain.stdout.strip() == "out=" and replaces.stdout.strip() == "out=/opt/module/lib"


@pytest.mark.parametrize("present, env_image, expect", [
    ("cpu-torch-ddp.sif", None, "image {d}/cpu-torch-ddp.sif"),            # build --sif's file, found
    ("cpu-torch-ddp", None, "image {d}/cpu-torch-ddp"),                    # the directory wins
    ("cpu-torch-ddp.sif", "elsewhere", "image 'elsewhere' not found"),     # a named image is never swapped
    (None, None, "image '{d}/cpu-torch-ddp' not found"),
], ids=["sif", "directory", "named", "none"])
def test_charliecloud_job_takes_the_sif_build_wrote_when_no_directory_image_is_there(tmp_path, present, env_image,
                                                                                     expect):
    """The charliecloud job's image lines (as rendered, run by bash): with no image named at submit
    time and no directory image, the .sif `build --sif` wrote beside the script (issue 47)."""
    text = render(tmp_path, RECIPES / "cpu-torch-ddp.yaml", "--runtime", "charliecloud")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('IMAGE="${ENVBUILDER_IMAGE:-'))
    end = next(i for i, line in enumerate(lines) if line.startswith("export IMAGE"))
    folder = tmp_path / "job"
    folder.mkdir()
    if present and present.endswith(".sif"):
        (folder / present).write_bytes(b"SIF")
    elif present:
        (folder / present).mkdir()
    script = "\n".join(['note() { echo "note: $*" >&2; }', 'die() { echo "die: $*" >&2; exit 2; }',
                        f'JOB_DIR="{folder}"', *lines[start:end], 'echo "image $IMAGE"'])
    env = {"PATH": os.environ["PATH"], **({"ENVBUILDER_IMAGE": env_image} if env_image else {})}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert expect.format(d=folder) in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert proc.returncode == (2 if "not found" in expect else 0)
