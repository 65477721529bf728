"""A .sif without Apptainer (verify only): charliecloud runs the smoke suite from the SIF's own
SquashFS partition (mounted at its byte offset by squashfuse), entering through
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
from contextlib import contextmanager
from pathlib import Path

from ..errors import EnvbuilderError
from ..paths import SUITE_MODULE
from ..sif import check, layout
from .base import Launch, Runtime, user_env

ENTRY = "/.singularity.d/actions/exec"


def is_sif(path: str | None) -> bool:
    if not path or not os.path.isfile(path):
        return False
    try:
        layout.read(Path(path))
        return True
    except (layout.NotSif, OSError):
        return False


class SifCharliecloud(Runtime):
    """A SIF run by charliecloud: structure first (siftool), then the suite in the partition.
    Reported as the charliecloud runtime; chosen by runtimes.for_target when the image is a SIF."""

    name = "charliecloud"
    in_verify = True

    def __init__(self, sif: str | None = None):
        self.sif = Path(sif) if sif else None
        self.info: dict | None = None

    def argv(self, root: Path, opts, suite, manifest: str | None) -> list[str]:
        return (["ch-run", "--set-env=PYTHONNOUSERSITE=1", str(root), "--", ENTRY, opts.python or "python",
                 "-m", SUITE_MODULE] + suite(manifest))

    @contextmanager
    def session(self, t, opts, suite):
        if not shutil.which("ch-run"):
            raise EnvbuilderError("--runtime charliecloud", "ch-run is not on PATH",
                                  "install charliecloud (apt-get install charliecloud)")
        check_unprivileged()
        sif = self.sif or Path(t.image)
        self.info = info = check.structure(sif)
        # what to compare with: the folder's manifest, else the one the SIF carries as an object;
        # ch-run binds the host's /tmp, so a file there is seen at the same path inside
        expected = json.loads(t.manifest_path.read_text()) if t.manifest_path else check.embedded_manifest(sif)
        if expected and not t.manifest:
            t.manifest = expected
        share = Path(tempfile.mkdtemp(prefix="envbuilder-sif-verify-", dir="/tmp"))
        try:
            manifest = None
            if expected:
                (share / "manifest.json").write_text(json.dumps(expected))
                manifest = str(share / "manifest.json")
            with check.mounted(sif, info["partition"]["offset"]) as root:
                yield Launch(self.argv(root, opts, suite, manifest), user_env())
        finally:
            shutil.rmtree(share, ignore_errors=True)

    def annotate(self, report):
        if self.info is not None:
            report["sif"] = {k: v for k, v in self.info.items() if k != "siftool_list"}


def check_unprivileged(fuse: str = "/dev/fuse", userns: str = "/proc/sys/user/max_user_namespaces") -> None:
    """What `verify x.sif` needs from the machine, before any work: squashfuse opens /dev/fuse
    (fusermount3 is setuid; the device must be open to the user) and ch-run makes an
    unprivileged user namespace."""
    if not os.access(fuse, os.R_OK | os.W_OK):
        raise EnvbuilderError("verify x.sif", f"{fuse} is not readable and writable by you: squashfuse mounts "
                              "the SIF's SquashFS partition through it",
                              f"ask the admins for `chmod 0666 {fuse}` (the default on most distributions), or run "
                              "the SIF with Apptainer (`apptainer test x.sif`); see docs/login-node.md")
    try:
        allowed = int(Path(userns).read_text().strip())
    except (OSError, ValueError):
        allowed = 1             # no such knob: the kernel decides when ch-run asks
    if allowed == 0:
        raise EnvbuilderError("verify x.sif", f"unprivileged user namespaces are off ({userns} is 0): ch-run "
                              "needs one", "ask the admins for sysctl user.max_user_namespaces=15000 (or more); "
                              "see docs/login-node.md")
