"""An Apptainer definition file read the way Apptainer's parser splits it: a `Bootstrap:` line at
the start of a line opens a stage; `Key: value` lines before the first section are its header;
`%name [args]` at the start of a line opens a section whose body runs to the next section or stage.
Only what envbuilder's renderer writes is accepted (docker / docker-daemon bootstraps; the sections
of render/apptainer.py); anything else is refused by name, not guessed at."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import EnvbuilderError

BOOTSTRAP = re.compile(r"^bootstrap\s*:\s*(\S*)\s*$", re.I)
HEADER = re.compile(r"^([A-Za-z]+)\s*:\s*(.*?)\s*$")
SECTION = re.compile(r"^%([A-Za-z]+)(?:[ \t]+(.*?))?\s*$")
SECTIONS = ("setup", "files", "post", "environment", "labels", "help", "runscript", "test")
BOOTSTRAPS = ("docker-daemon", "docker")
FIX = "write it again from the spec: envbuilder build SPEC --no-build (never edit the generated file)"


@dataclass
class Section:
    name: str
    args: str
    body: str


@dataclass
class DefStage:
    header: dict[str, str]
    sections: list[Section] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.header.get("stage", "")

    @property
    def bootstrap(self) -> str:
        return self.header.get("bootstrap", "")

    @property
    def source(self) -> str:
        return self.header.get("from", "")

    def section(self, name: str) -> Section | None:
        found = [s for s in self.sections if s.name == name]
        return found[-1] if found else None

    def files(self) -> list[tuple[str, list[tuple[str, str]]]]:
        """[(from-stage or "", [(src, dst)])] in file order; Apptainer copies `from` sections first."""
        out = []
        for sec in self.sections:
            if sec.name != "files":
                continue
            args = sec.args.split("#")[0].split()
            src_stage = args[1] if len(args) == 2 and args[0] == "from" else ""
            pairs = []
            for line in sec.body.splitlines():
                words = line.split("#")[0].split()
                if not words:
                    continue
                pairs.append((words[0], words[1] if len(words) > 1 else words[0]))
            out.append((src_stage, pairs))
        return out

    def labels(self) -> dict[str, str]:
        sec = self.section("labels")
        out = {}
        for line in (sec.body if sec else "").splitlines():
            key, _, value = line.strip().partition(" ")
            if key:
                out[key] = value.strip()
        return out


def _dedent_end(lines: list[str]) -> str:
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def parse(text: str, where: str = "Apptainer.def") -> list[DefStage]:
    stages: list[DefStage] = []
    current: Section | None = None
    body: list[str] = []

    def close() -> None:
        nonlocal current, body
        if current is not None:
            current.body = _dedent_end(body)
        current, body = None, []

    for number, line in enumerate(text.splitlines(), 1):
        m = BOOTSTRAP.match(line)
        if m:
            close()
            stages.append(DefStage({"bootstrap": m.group(1)}))
            continue
        m = SECTION.match(line)
        if m:
            close()
            if not stages:
                raise EnvbuilderError(where, f"line {number}: %{m.group(1)} comes before any Bootstrap: line", FIX)
            name = m.group(1).lower()
            if name not in SECTIONS:
                raise EnvbuilderError(where, f"line {number}: section %{name} is not one envbuilder writes "
                                      f"(it writes %{', %'.join(SECTIONS)})", FIX)
            current = Section(name, m.group(2) or "", "")
            stages[-1].sections.append(current)
            continue
        if current is not None:
            body.append(line)
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        h = HEADER.match(line)
        if not h or not stages:
            raise EnvbuilderError(where, f"line {number}: {line.strip()[:80]!r} is neither a header line "
                                  "(Key: value after Bootstrap:) nor a section", FIX)
        stages[-1].header[h.group(1).lower()] = h.group(2)
    close()
    if not stages:
        raise EnvbuilderError(where, "has no Bootstrap: line", FIX)
    names = [s.name for s in stages]
    for i, stage in enumerate(stages):
        if stage.bootstrap.lower() not in BOOTSTRAPS:
            raise EnvbuilderError(where, f"stage {i + 1}: Bootstrap: {stage.bootstrap or '(empty)'} cannot be run "
                                  f"here (envbuilder writes {' or '.join(BOOTSTRAPS)})", FIX)
        if not stage.source:
            raise EnvbuilderError(where, f"stage {i + 1}: Bootstrap: {stage.bootstrap} has no From: line", FIX)
        for src_stage, _ in stage.files():
            if src_stage and src_stage not in names[:i]:
                raise EnvbuilderError(where, f"stage {stage.name or i + 1}: %files from {src_stage}: no earlier "
                                      "stage has that name", FIX)
    return stages
