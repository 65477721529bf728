"""Stack components, each one ``Component`` (components/base.py): its devel-stage steps by layer
slot, what the runtime stage keeps, its environment, what the lock must pin, its part of
manifest.json. ``COMPONENTS`` is the one order they are gathered in; ``assemble`` sorts the devel
stage by ``Layer``: what changes least comes first."""

from __future__ import annotations

from dataclasses import replace

from ...lock.model import PIP_GROUPS
from ..image import Copy, Plan, Stage, Step
from ...stack import Stack
from . import conda, cuda, fabric, framework, horovod, mpi, mpi4py, packages, python, smoke, system
from .base import LD_PATH_TAIL, Layer, LockNeeds

# The runtime stage copies in this order (the layers a change leaves cached come first: NVIDIA's
# wheels before the venv that holds them), and the environment merges in it.
COMPONENTS = (system.System(), fabric.Fabric(), mpi.Mpi(), cuda.Cuda(), python.Python(), framework.Framework(),
              horovod.Horovod(), packages.Packages(), mpi4py.Mpi4py(), conda.Conda())


def lock_needs(stack: Stack) -> LockNeeds:
    """Every component's lock needs, in one pass: the OS packages per stage as system.py installs
    them, the pip groups in the lock's group order, the tarballs, conda's input."""
    parts = [part.lock_needs(stack) for part in COMPONENTS]
    groups: dict[str, list[str]] = {}
    for need in parts:            # two components may add to one group (build: mpi4py's Cython, py-rattler)
        for group, reqs in need.pip_groups.items():
            have = groups.setdefault(group, [])
            have.extend(r for r in reqs if r not in have)
    return LockNeeds(apt=system.stage_packages(stack, (need.apt for need in parts)),
                     pip_groups={group: groups[group] for group in PIP_GROUPS if group in groups},
                     tarballs=[tar for need in parts for tar in need.tarballs],
                     conda=next((need.conda for need in parts if need.conda), None))


def assemble(stack: Stack) -> Plan:
    spec = stack.spec
    packages_ = lock_needs(stack).apt
    slots: dict[Layer, list[Step]] = {Layer.OS: system.devel_steps(stack, packages_["devel"])}
    for part in COMPONENTS:
        for layer, steps in part.devel(stack).items():
            slots.setdefault(layer, []).extend(steps)
    # with a lock the spec's packages build in a stage of their own on top of the devel stage: the
    # runtime stage's venv COPY reads the devel stage's last snapshot, which a changed pin then
    # leaves as it was (BuildKit checksums a changed snapshot's files again: 5 s for the torch
    # venv), and copies /opt/packages from this stage (components/packages.py)
    apart = python.packages_apart(stack) and bool(slots.get(Layer.PACKAGES))
    devel = Stage("devel", _base(stack, "devel", stack.base))
    devel.items += [step for layer in Layer for step in slots.get(layer, [])
                    if not (apart and layer is Layer.PACKAGES)]

    if stack.ngc is not None:
        # An NGC image already is a complete devel + runtime image: one stage, add what is missing.
        devel.name = "image"
        final = devel
        stages = [devel]
    else:
        final = Stage("runtime", _base(stack, "runtime", stack.runtime_base))
        final.items += system.runtime_steps(stack, packages_["runtime"])
        final.items += _layered([copy for part in COMPONENTS for copy in part.runtime(stack)])
        stages = [devel, final]
        if apart:
            stages.insert(1, Stage(packages.STAGE, devel.name, list(slots[Layer.PACKAGES]),
                                   role="the spec's packages on top of devel; only /opt/packages is copied on"))
    final.items += smoke.install(stack)

    env: dict[str, str] = {}
    notes: dict[str, str] = {}
    for part in COMPONENTS:
        for key, value in part.env(stack).items():
            if key in ("PATH", "LD_LIBRARY_PATH") and key in env:   # components extend these, none replaces
                value = (value.replace(LD_PATH_TAIL, ":" + env[key]) if key == "LD_LIBRARY_PATH"
                         else value.replace("$PATH", env[key]))
            env[key] = value
        notes.update(part.env_notes(stack))
    env.update(dict(spec.env))
    notes = {k: why for k, why in notes.items() if k in env and k not in dict(spec.env)}
    return Plan(name=spec.name, stages=stages, env=env, labels=smoke.labels(stack),
                help=smoke.help_text(stack), runscript=["python"], test=smoke.test_command(stack),
                literal_env=frozenset(k for k, _ in spec.env), env_notes=notes, expect=expect(stack),
                horovod_patches=tuple(name for name, _ in horovod.patches(stack)), base_from=spec.base_from,
                platform=None if spec.target_arch == "x86_64" else stack.catalog.arch(spec.target_arch)["docker"])


# manifest.json's expect keys in the order manifests have always had them (older manifests stay
# byte for byte); a component's new key needs its place here.
EXPECT_KEYS = ("python", "arch", "framework", "horovod", "mpi", "cuda", "cudnn", "nccl", "gpu", "packages", "cuda_source",
               "cuda_arch", "cuda_runtime", "cpu_env", "distributed", "apt", "conda")


def expect(stack: Stack) -> dict:
    """What the image promises (the smoke suite checks it): every component's part."""
    out = {key: value for part in COMPONENTS for key, value in part.expect(stack).items()}
    return dict(sorted(out.items(), key=lambda item: EXPECT_KEYS.index(item[0])))


def _layered(copies: list[Copy]) -> list[Copy]:
    """Each copy less what earlier copies brought as layers of their own (NVIDIA's wheels, inside
    the venv): a file is copied once."""
    return [replace(c, without=tuple(e.source for e in copies[:i] if e.source.startswith(c.source + "/")))
            for i, c in enumerate(copies)]


def _base(stack: Stack, stage: str, ref: str) -> str:
    """The FROM reference: with a lock, ref@digest (a registry image); a local image keeps its tag
    (BuildKit cannot address it by ID) and `envbuilder build` checks the ID before building."""
    entry = stack.lock.base.get(stage) if stack.lock else None
    return entry["pinned"] if entry else ref
