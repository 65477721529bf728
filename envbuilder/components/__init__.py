"""Stack components. Each owns its devel-stage steps, what the runtime stage keeps, and its
environment. ``assemble`` puts them together in layer order: what changes least comes first."""

from __future__ import annotations

from ..plan import Plan, Stage
from ..resolve import Stack
from . import conda, cuda, fabric, framework, horovod, mpi, mpi4py, packages, python, smoke, system


def assemble(stack: Stack) -> Plan:
    spec = stack.spec
    devel = Stage("devel", _base(stack, "devel", stack.base))
    devel.items += system.devel_steps(stack)
    devel.items += fabric.libfabric_steps(stack)        # before the MPI that builds against it
    devel.items += mpi.devel_steps(stack)
    devel.items += python.devel_steps(stack)
    devel.items += cuda.wheel_steps(stack)
    devel.items += framework.devel_steps(stack)
    devel.items += mpi.wheel_steps(stack)
    devel.items += cuda.toolkit_steps(stack)
    devel.items += horovod.devel_steps(stack)
    devel.items += fabric.plugin_steps(stack)           # needs the CUDA toolkit slim_steps removes
    devel.items += cuda.slim_steps(stack)
    devel.items += packages.pip_steps(stack)
    devel.items += mpi4py.devel_steps(stack)          # over any mpi4py wheel a package brought
    devel.items += conda.devel_steps(stack)

    if stack.ngc is not None:
        # An NGC image already is a complete devel + runtime image: one stage, add what is missing.
        devel.name = "image"
        final = devel
        stages = [devel]
    else:
        final = Stage("runtime", _base(stack, "runtime", stack.runtime_base))
        final.items += system.runtime_steps(stack)
        wheels = cuda.runtime_copies(stack)         # NVIDIA's libraries: a layer before the venv's
        final.items += (fabric.runtime_copies(stack) + mpi.runtime_copies(stack) + wheels + python.runtime_copies(stack, without=wheels)
                        + conda.runtime_copies(stack))
        stages = [devel, final]
    final.items += smoke.install(stack)

    env: dict[str, str] = {}
    for part in (system, fabric, mpi, python, framework, horovod, conda):
        for key, value in part.runtime_env(stack).items():
            if key in ("PATH", "LD_LIBRARY_PATH") and key in env:   # components extend these, none replaces
                value = value.replace(f"${{{key}:-}}" if key == "LD_LIBRARY_PATH" else "$PATH", env[key])
            env[key] = value
    env.update(dict(spec.env))
    notes = {k: why for k, why in mpi.runtime_env_notes(stack).items() if k in env and k not in dict(spec.env)}
    return Plan(name=spec.name, stages=stages, env=env, labels=smoke.labels(stack),
                help=smoke.help_text(stack), runscript=["python"], test=smoke.test_command(stack),
                literal_env=frozenset(k for k, _ in spec.env), env_notes=notes)


def _base(stack: Stack, stage: str, ref: str) -> str:
    """The FROM reference: with a lock, ref@digest (a registry image); a local image keeps its tag
    (BuildKit cannot address it by ID) and `envbuilder build` checks the ID before building."""
    entry = stack.lock.base.get(stage) if stack.lock else None
    return entry["pinned"] if entry else ref
