"""apptainer and singularity (SingularityCE): a .sif per image, entered with `exec`."""

from __future__ import annotations

import os
import shlex
import shutil
from contextlib import contextmanager
from pathlib import Path

from .. import emulation
from ..errors import EnvbuilderError
from ..sif import layout
from ..paths import SUITE_MODULE, VERIFY_MANIFEST
from .base import Launch, Runtime


def apptainer_argv(image: str, suite: list[str], *, manifest_path: Path | None = None,
                   apptainer: str = "apptainer", python: str = "python") -> list[str]:
    """`apptainer exec --nv IMAGE.sif python -m envbuilder_smoke ...` (what verify runs)."""
    argv = [apptainer, "exec", "--nv"]
    if manifest_path:
        argv += ["--bind", f"{manifest_path}:{VERIFY_MANIFEST}:ro"]
    return argv + [image, python, "-m", SUITE_MODULE] + suite


def check_runnable_here(image: Path) -> None:
    """A .sif of another architecture (an arm64 image on an x86_64 machine) runs only under QEMU:
    refused by name before Apptainer starts where this machine has no emulation for it (Apptainer's
    own refusal names neither the cause nor the fix). A sandbox folder or an unreadable file is
    left to Apptainer."""
    try:
        found = layout.root_arch(image)
    except (OSError, layout.NotSif):
        return
    arch = emulation.UNAME_OF.get(found)
    if arch:
        emulation.require_runnable(arch, "--image", f"{image} ({found})")


class Apptainer(Runtime):
    name = "apptainer"
    in_job = True
    in_verify = True
    image_suffix = ".sif"
    bind_list_separator = ","     # --bind src[:dest[:opts]][,...]
    bind_list_source = "apptainer_bind"
    # A variable the image sets (its ENV, %environment) keeps the image's value: from the host
    # only the unset ones pass; APPTAINERENV_NAME wins over the image (research/apptainer.md 1c;
    # run here: a host OMPI_MCA_btl_vader_single_copy_mechanism=cma stayed the image's none)
    env_prefix = "APPTAINERENV_"
    stages_image = True           # a .sif: one file

    @property
    def hint(self) -> str:
        return f"build it with: {self.name} build IMAGE.sif Apptainer.def"

    def default_image(self, manifest, folder, cwd):
        return str((folder or cwd) / f"{manifest.get('name', 'image')}.sif")

    def command(self, t, opts, suite, **how):
        mounted = t.manifest_path or None
        exe = shutil.which("apptainer") or shutil.which("singularity") or "apptainer"
        return apptainer_argv(t.image, suite(VERIFY_MANIFEST if mounted else None), manifest_path=mounted,
                              apptainer=exe, python=opts.python or "python"), None

    @contextmanager
    def session(self, t, opts, suite):
        argv, env = self.command(t, opts, suite)
        if not (shutil.which("apptainer") or shutil.which("singularity")):
            raise EnvbuilderError("--runtime apptainer", "apptainer (or singularity) is not installed "
                                  "on this machine; on one that has it, verify runs:\n  "
                                  + " ".join(shlex.quote(a) for a in argv),
                                  "run that command on a cluster node, or use --runtime docker|host")
        if not os.path.exists(t.image):
            raise EnvbuilderError("--image", f"{t.image} does not exist",
                                  "build it: apptainer build IMAGE.sif Apptainer.def (or give --image)")
        check_runnable_here(Path(t.image))
        yield Launch(argv, env)

    def job_bind_args(self):
        return ['for b in "${binds[@]}"; do runtime_args+=(--bind "$b"); done']

    def job_launch(self, gpu):
        nv = " --nv" if gpu else ""
        return [
            "# No --cleanenv/--containall: srun's SLURM_*/PMIX_* variables must reach the ranks,",
            "# and a private IPC namespace per rank would cut NCCL's shared-memory paths (F2, F4).",
            "# Apptainer also takes both from the environment (APPTAINER_CLEANENV=1, or SINGULARITY_*",
            "# under either name: a site module or a ~/.bashrc may set them). Run by hand with real",
            "# Apptainer 1.4.5 on the test cluster, every rank of 2 nodes x 2 then said 'rank 0 of 1'",
            "# in Horovod, and this script's ranks ended 'rank_main: command not found' (exit 127):",
            "# named here, before any rank (tests/test_apptainer_jobs.py)",
            "contained_env() {",
            "    local v",
            "    for v in APPTAINER_CLEANENV APPTAINER_CONTAINALL SINGULARITY_CLEANENV SINGULARITY_CONTAINALL; do",
            '        case ${!v:-} in ""|0|f|F|false|False|FALSE) ;; *) echo "$v" ;; esac',
            "    done",
            "}",
            "for v in $(contained_env); do",
            '    case $v in *CONTAINALL) what="--containall (also a private /tmp and /dev/shm per rank)" ;;'
            ' *) what="--cleanenv" ;; esac',
            f'    die "{self.name}: $v=${{!v}} is set: $what drops the SLURM_* and PMIX_* variables of srun in every'
            ' container, so each rank starts alone as rank 0 of 1 (a world of size 1) and MPI ranks never meet;'
            ' unset it for this job: env -u $v sbatch job.sbatch"',
            "done",
            f'launch=({self.name} exec{nv} --home "$HOME" "${{runtime_args[@]}}" "$IMAGE")',
        ]


class Singularity(Apptainer):
    """SingularityCE: Apptainer's command line under its older name (job.sbatch only; verify's
    apptainer runtime takes whichever of the two is installed)."""

    name = "singularity"
    in_verify = False
    env_prefix = "SINGULARITYENV_"     # SingularityCE's; Apptainer reads it too (APPTAINERENV_ first)
