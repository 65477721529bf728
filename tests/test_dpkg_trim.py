"""The runtime stage's dpkg trim (plan/components/system.py DPKG_TRIM): every preset's Dockerfile
and Apptainer.def (images/, the rendered goldens test_render keeps current) write
/etc/dpkg/dpkg.cfg.d/envbuilder-trim before the runtime stage's apt-get install, and only there.
The file's lines are taken from the rendered RUN line / %post line as the shell splits them and
matched against paths as dpkg matches them (dpkg(1) --path-exclude/--path-include: shell globs
where * also matches /, the last matching option wins), so a licence, the CA bundle, time zone data
and the C.UTF-8 locale stay, documentation, manual pages and translations go.
(In a built image: bench/dpkg_trim.py and tests/test_build_verify.py.)"""

from __future__ import annotations

import fnmatch
import shlex
from pathlib import Path

import pytest

from conftest import ROOT

from envbuilder.plan.components.system import DPKG_TRIM, DPKG_TRIM_FILE

IMAGES = sorted(p for p in (ROOT / "images").iterdir() if (p / "Dockerfile").is_file())

KEPT = ["/usr/share/doc/bash/copyright", "/usr/share/doc/libopenmpi3/copyright",
        "/etc/ssl/certs/ca-certificates.crt", "/usr/share/ca-certificates/mozilla/ISRG_Root_X1.crt",
        "/usr/share/zoneinfo/UTC", "/usr/share/zoneinfo/Europe/Berlin",
        "/usr/lib/locale/C.utf8/LC_CTYPE", "/usr/share/locale/locale.alias",
        "/usr/lib/x86_64-linux-gnu/libmpi.so.40", "/usr/bin/python3.11",
        "/usr/share/common-licenses/GPL-3", "/usr/share/i18n/charmaps/UTF-8.gz"]
DROPPED = ["/usr/share/doc/bash/changelog.Debian.gz", "/usr/share/doc/python3.11/README.venv",
           "/usr/share/doc/libopenmpi3/examples/hello_c.c",
           "/usr/share/man/man1/ls.1.gz", "/usr/share/man/de/man1/ls.1.gz",
           "/usr/share/info/bash.info.gz", "/usr/share/locale/de/LC_MESSAGES/coreutils.mo",
           "/usr/share/lintian/overrides/bash", "/usr/share/groff/1.22.4/font/devps/TR"]


def kept(config: list[str], path: str) -> bool:
    """dpkg's filter: included unless excluded, the last matching option deciding."""
    keep = True
    for line in config:
        option, _, glob = line.partition("=")
        assert option in ("path-exclude", "path-include"), line
        if fnmatch.fnmatchcase(path, glob):
            keep = option == "path-include"
    return keep


def config_from(command: str) -> list[str]:
    """The lines a rendered `printf '%s\\n' LINE... > FILE` writes, as the shell splits it."""
    words = shlex.split(command)
    assert words[:2] == ["printf", "%s\\n"] and words[-2:] == [">", DPKG_TRIM_FILE], words
    return words[2:-2]


def docker_stages(text: str) -> list[list[str]]:
    """The Dockerfile's stages, each as its instructions (continuation lines joined)."""
    joined = text.replace("\\\n", " ")
    stages: list[list[str]] = []
    for line in joined.splitlines():
        if line.startswith("FROM "):
            stages.append([])
        if stages and line and not line.startswith("#"):
            stages[-1].append(line)
    return stages


def apptainer_stages(text: str) -> list[list[str]]:
    stages: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("Bootstrap:"):
            stages.append([])
        if stages:
            stages[-1].append(line.strip())
    return stages


def trim_commands_docker(stage: list[str]) -> list[str]:
    out = []
    for line in stage:
        if line.startswith("RUN ") and DPKG_TRIM_FILE in line:
            parts = [p.strip() for p in line[4:].split(" && ")]
            out += [p for p in parts if DPKG_TRIM_FILE in p and p.startswith("printf")]
            # written before the install, in the same RUN
            assert parts.index(out[-1]) < next(i for i, p in enumerate(parts) if "apt-get install" in p)
    return out


def test_the_config_keeps_what_a_job_needs_and_drops_documentation():
    for path in KEPT:
        assert kept(DPKG_TRIM, path), path
    for path in DROPPED:
        assert not kept(DPKG_TRIM, path), path


@pytest.mark.parametrize("folder", IMAGES, ids=lambda p: p.name)
def test_dockerfile_trims_the_runtime_stage_only(folder: Path):
    stages = docker_stages((folder / "Dockerfile").read_text())
    runtime = [s for s in stages if s[0].endswith(" AS runtime")]
    others = [s for s in stages if not s[0].endswith(" AS runtime")]
    for stage in others:
        assert not trim_commands_docker(stage), f"{folder.name}: a non-runtime stage is trimmed"
    if not runtime:               # one stage (an NGC base): it is the devel stage, left as it is
        assert len(stages) == 1
        return
    (command,) = trim_commands_docker(runtime[0])
    assert config_from(command) == DPKG_TRIM


@pytest.mark.parametrize("folder", IMAGES, ids=lambda p: p.name)
def test_apptainer_def_trims_the_runtime_stage_only(folder: Path):
    stages = apptainer_stages((folder / "Apptainer.def").read_text())
    for stage in stages:
        lines = [ln for ln in stage if DPKG_TRIM_FILE in ln and ln.startswith("printf")]
        if "Stage: runtime" not in stage:
            assert not lines, f"{folder.name}: a non-runtime stage is trimmed"
            continue
        (command,) = lines
        assert config_from(command) == DPKG_TRIM
        post = stage[stage.index("%post"):]
        assert post.index(command) < next(i for i, ln in enumerate(post) if "apt-get install" in ln)
