"""The one shape of a component (hpccm's building block, learned once): what it adds to the devel
stage, by layer slot; what the runtime stage keeps; the image's environment; what the lock must pin
for it; its part of manifest.json's ``expect``. Every method has a neutral default, so a component
writes only what it has. ``components.COMPONENTS`` lists them in the one order the runtime stage,
the environment and the lock's needs are gathered in; the devel stage is sorted by ``Layer``."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto

from ..image import Copy, Step
from ...stack import Stack

# How a component's LD_LIBRARY_PATH keeps what was there: a colon and the old value only when there
# is one (`dir:${LD_LIBRARY_PATH:-}` left an empty entry when unset, and an empty entry makes the
# loader search the current folder). Docker, BuildKit, buildah and sh all expand ${X:+word}.
LD_PATH_TAIL = "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"


class Layer(Enum):
    """The devel stage's slots, in build order: what changes least first, and each after what it
    builds against."""
    OS = auto()                 # the one apt step: every component's OS packages (system.py)
    LIBFABRIC = auto()          # before the MPI that builds against it
    MPI_BUILD = auto()          # MPI from its release tarball
    PYTHON = auto()             # the venv
    CUDA_WHEELS = auto()        # NVIDIA's wheels the framework depends on (lock only)
    FRAMEWORK = auto()
    MPI_WHEEL = auto()          # after the framework: a different MPI re-installs a small wheel
    CUDA_TOOLKIT = auto()
    HOROVOD = auto()
    NCCL_PLUGIN = auto()        # needs the CUDA toolkit CUDA_SLIM removes
    CUDA_SLIM = auto()
    PACKAGES = auto()           # the pins users change most often: a changed pin rebuilds one small layer
    MPI4PY = auto()             # over any mpi4py wheel a package brought
    CONDA = auto()


@dataclass
class LockNeeds:
    """What a component needs the lock to pin."""
    apt: dict[str, list[str]] = field(default_factory=dict)          # stage (devel, runtime) -> OS packages
    pip_groups: dict[str, list[str]] = field(default_factory=dict)   # lock pip group -> requirements
    tarballs: list[dict] = field(default_factory=list)   # name, version, url, file, sha256, index
    conda: dict | None = None                            # the conda resolver's input


class Component:
    """A part of the image. Subclasses override what they add; the defaults add nothing."""

    def devel(self, stack: Stack) -> dict[Layer, list[Step]]:
        """The devel stage's steps, by slot."""
        return {}

    def runtime(self, stack: Stack) -> list[Copy]:
        """What the runtime stage copies from the devel stage (no runtime stage on an NGC base)."""
        return []

    def env(self, stack: Stack) -> dict[str, str]:
        """The image's environment; PATH and LD_LIBRARY_PATH extend the earlier components' values."""
        return {}

    def env_notes(self, stack: Stack) -> dict[str, str]:
        """Why a variable of ``env`` is set: a comment beside it in the recipes."""
        return {}

    def lock_needs(self, stack: Stack) -> LockNeeds:
        return LockNeeds()

    def expect(self, stack: Stack) -> dict:
        """Its keys of manifest.json's ``expect``: what the smoke suite checks in the image."""
        return {}
