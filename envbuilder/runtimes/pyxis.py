"""pyxis: srun itself enters the container (enroot), given --container-image (job.sbatch only)."""

from __future__ import annotations

from .base import Runtime


class Pyxis(Runtime):
    name = "pyxis"
    in_job = True
    image_suffix = ".sqsh"
    launches_on_host = False      # srun --container-image opens the image; launch[] is empty
    bind_list_separator = ","     # --container-mounts=SRC:DST[:FLAGS][,SRC:DST...]
    bind_list_source = "pyxis_mounts"
    hint = "import it with: enroot import docker://REF, or give a registry reference"

    def job_check_image(self):
        # a registry reference is pulled by pyxis; only a file path can be checked here
        return [
            'case $IMAGE in',
            '    /*|./*)',
            '        if [ ! -e "$IMAGE" ]; then',
            f'            die "image \'$IMAGE\' not found (set ENVBUILDER_IMAGE or cluster.image_path; {self.hint})"',
            "        fi ;;",
            "esac",
        ]

    def job_bind_args(self):
        return ['mounts=$(IFS=,; echo "${binds[*]}")',
                'runtime_args+=(--container-image="$IMAGE" --container-mounts="$mounts" --no-container-mount-home)']

    def job_launch(self, gpu):
        return ["# pyxis: srun itself enters the container; the rank set-up runs inside it (bash)",
                "launch=()"]

    srun_extra = ' "${runtime_args[@]}"'
