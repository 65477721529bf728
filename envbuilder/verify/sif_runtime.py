"""verify's runtime for a .sif without Apptainer: charliecloud runs the smoke suite from the
SIF's own SquashFS partition (mounted at its byte offset by squashfuse), entering through
/.singularity.d/actions/exec, so the image's environment comes from the SIF's env scripts as
`apptainer exec` would take it, not from Docker's config.

    envbuilder verify images/cpu-torch-horovod/cpu-torch-horovod.sif --ranks 2
    envbuilder verify images/cpu-torch-horovod --image images/cpu-torch-horovod/x.sif --runtime charliecloud
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import EnvbuilderError
from ..sif import check, layout
from .runner import SUITE_MODULE, Outcome, Target, VerifyOptions, execute, suite_args, total_timeout

ENTRY = "/.singularity.d/actions/exec"


def is_sif(path: str | None) -> bool:
    if not path or not os.path.isfile(path):
        return False
    try:
        layout.read(Path(path))
        return True
    except (layout.NotSif, OSError):
        return False


class SifCharliecloud:
    """A SIF run by charliecloud: structure first (siftool), then the suite in the partition."""

    name = "charliecloud"

    def __init__(self, sif: str):
        self.sif = Path(sif)

    def argv(self, root: Path, opts: VerifyOptions, manifest: str | None) -> list[str]:
        extra = ["--require-gpu"] if opts.require_gpu else []
        suite = suite_args(opts.ranks, opts.timeout, manifest, opts.launcher, extra)
        return (["ch-run", "--set-env=PYTHONNOUSERSITE=1", str(root), "--", ENTRY, opts.python or "python",
                 "-m", SUITE_MODULE] + suite)

    def run(self, t: Target, opts: VerifyOptions) -> Outcome:
        if not shutil.which("ch-run"):
            raise EnvbuilderError("--runtime charliecloud", "ch-run is not on PATH",
                                  "install charliecloud (apt-get install charliecloud)")
        info = check.structure(self.sif)
        # what to compare with: the folder's manifest, else the one the SIF carries as an object;
        # ch-run binds the host's /tmp, so a file there is seen at the same path inside
        expected = json.loads(t.manifest_path.read_text()) if t.manifest_path else check.embedded_manifest(self.sif)
        if expected and not t.manifest:
            t.manifest = expected
        share = Path(tempfile.mkdtemp(prefix="envbuilder-sif-verify-", dir="/tmp"))
        try:
            manifest = None
            if expected:
                (share / "manifest.json").write_text(json.dumps(expected))
                manifest = str(share / "manifest.json")
            env = dict(os.environ)
            env.setdefault("USER", "root" if os.geteuid() == 0 else str(os.geteuid()))
            with check.mounted(self.sif, info["partition"]["offset"]) as root:
                outcome = execute(self.argv(root, opts, manifest), timeout=total_timeout(opts), env=env,
                                  echo_stderr=opts.echo_stderr)
        finally:
            shutil.rmtree(share, ignore_errors=True)
        if outcome.report is not None:
            outcome.report["sif"] = {k: v for k, v in info.items() if k != "siftool_list"}
        return outcome
