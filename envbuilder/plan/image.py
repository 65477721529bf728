"""A format-neutral build plan: stages of commented steps, assembled from the components.

Renderers (Dockerfile, Apptainer.def) only format a Plan; they decide nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Step:
    component: str
    title: str                      # one comment line above the step
    commands: list[str]             # shell commands, run in order, stop at the first failure
    build_env: dict[str, str] = field(default_factory=dict)   # only while this step runs
    network: bool = False           # downloads: gets the CA bundle and the wheelhouse mounted
    notes: list[str] = field(default_factory=list)            # extra comment lines (why)
    mounts: list[str] = field(default_factory=list)           # build-context files the step reads
                                                              # (pins/...: bind-mounted at /<path>)


@dataclass
class Copy:
    source: str                     # path in the build context (from_stage None) or in a stage
    dest: str
    from_stage: str | None = None
    without: tuple[str, ...] = ()   # paths under source left out: earlier Copies bring them as
                                    # layers of their own (a SIF has no layers: copied whole)


@dataclass
class Stage:
    name: str
    base: str                                   # an image, or an earlier stage's name
    items: list = field(default_factory=list)   # Step and Copy, in order
    role: str = ""                              # the stage's header comment, where the default
                                                # (devel / runtime) does not fit

    @property
    def steps(self) -> list[Step]:
        return [i for i in self.items if isinstance(i, Step)]


@dataclass
class Plan:
    name: str
    stages: list[Stage]
    env: dict[str, str]             # runtime environment of the final image (ordered)
    labels: dict[str, str]
    help: str
    runscript: list[str]            # default command
    test: list[str]                 # the smoke suite as Apptainer's %test
    workdir: str = "/workspace"
    literal_env: frozenset = frozenset()   # env keys whose values are text as written (the
                                           # spec's): no $ expansion in Docker or Apptainer
    env_notes: dict[str, str] = field(default_factory=dict)   # why a variable is set: a comment
                                                               # above ENV / in %environment
    expect: dict = field(default_factory=dict)      # what the image promises (manifest.json's
                                                    # expect, the smoke suite checks it)
    horovod_patches: tuple[str, ...] = ()           # the catalog's source fixes applied to Horovod
    base_from: str = "auto"                         # how Apptainer.def's build reads the bases (spec)
    platform: str | None = None                     # Docker's platform of a non-x86_64 image (catalog
                                                    # arches): FROM --platform= takes that image of a base

    @property
    def final(self) -> Stage:
        return self.stages[-1]

