"""OS packages: one apt step per stage, gathering what every component needs.

Owns: the locale and the apt invocation. Other components only name their packages
(``LockNeeds.apt``); ``components.assemble`` hands them in gathered (``stage_packages``).
"""

from __future__ import annotations

from collections.abc import Iterable

from ...lock.pins import apt_file
from ..image import Step
from ...stack import Stack
from .base import Component


# apt's caches, removed in the step that made them, whatever the base's apt settings: Docker
# Hub's debian images delete them through /etc/apt/apt.conf.d/docker-clean, a base made by plain
# debootstrap keeps the .deb files (135 MB for the torch image) and pkgcache.bin/srcpkgcache.bin
# (which differ between two builds of one lock).
APT_CLEAN = ["apt-get clean",
             "rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb "
             "/var/cache/apt/archives/partial/*"]


def _apt_install(packages_: list[str]) -> list[str]:
    return [
        "apt-get update",
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
        + " ".join(sorted(set(packages_))),
        *APT_CLEAN,
    ]


def stage_packages(stack: Stack, asked: Iterable[dict[str, list[str]]]) -> dict[str, list[str]]:
    """What each stage installs with apt (names, or name=version where the spec pins), from what
    the components ask per stage. An NGC base is one stage that has the rest: only the spec's."""
    if stack.ngc:
        return {"devel": sorted(set(stack.spec.packages.apt))}
    out = {"devel": {"ca-certificates"}, "runtime": {"ca-certificates"}}
    for apt in asked:
        for stage, pkgs in apt.items():
            out[stage].update(pkgs)
    return {stage: sorted(pkgs) for stage, pkgs in out.items()}


def _locked_install(stage: str) -> tuple[list[str], str]:
    """apt-get install of the exact versions the lock holds (pins/apt-STAGE.txt, bind-mounted)."""
    pins = apt_file(stage)
    return [
        "apt-get update",
        f"xargs -a /{pins} env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends",
        *APT_CLEAN,
        # logs and caches that carry the build's wall-clock time: gone, so two builds of one lock
        # give the same bytes (update-alternatives logs the time of every link it sets)
        "rm -rf /var/log/apt /var/log/dpkg.log /var/log/alternatives.log /var/cache/ldconfig/aux-cache",
    ], pins


def _step(stack: Stack, stage: str, title: str, pkgs: list[str]) -> Step:
    lock = stack.lock
    if lock is not None and lock.apt.get(stage):
        cmds, pins = _locked_install(stage)
        return Step("system", title, cmds, mounts=[pins],
                    notes=[f"{len(lock.apt[stage])} packages at the versions in envbuilder.lock ({pins})"])
    return Step("system", title, _apt_install(pkgs))


def devel_steps(stack: Stack, pkgs: list[str]) -> list[Step]:
    if stack.ngc:
        if not pkgs:
            return []
        return [_step(stack, "devel", "OS packages the spec asks for (the NGC image has the rest)", pkgs)]
    return [_step(stack, "devel", "OS packages for building: compilers and headers (this stage is discarded)",
                  pkgs)]


# What no run needs, left out of the runtime stage's packages by dpkg itself (dpkg(1) --path-exclude
# / --path-include, read from /etc/dpkg/dpkg.cfg.d/; the last matching option wins): documentation,
# manual and info pages, translations, lintian overrides, groff's fonts. Kept: each package's
# licence (/usr/share/doc/PKG/copyright), locale.alias, and everything else a job may read: the CA
# bundle (/etc/ssl, /usr/share/ca-certificates), /usr/share/zoneinfo, /usr/lib/locale (C.UTF-8:
# the smoke check env.locale). Written before the stage's apt-get install, so it acts on every
# package that step installs; it stays in the image, so an apt-get install in an image built FROM
# this one leaves the same paths out. Files the base image already holds are left as they are
# (deleting them would only add whiteouts to a layer). The devel stage keeps its documentation.
# Bookworm's dpkg still unpacks the symbolic links under an excluded path (dangling, a few bytes).
DPKG_TRIM_FILE = "/etc/dpkg/dpkg.cfg.d/envbuilder-trim"
DPKG_TRIM = ["path-exclude=/usr/share/doc/*",
             "path-include=/usr/share/doc/*/copyright",
             "path-exclude=/usr/share/man/*",
             "path-exclude=/usr/share/info/*",
             "path-exclude=/usr/share/locale/*",
             "path-include=/usr/share/locale/locale.alias",
             "path-exclude=/usr/share/lintian/*",
             "path-exclude=/usr/share/groff/*"]


def dpkg_trim_commands() -> list[str]:
    """The shell lines that write DPKG_TRIM_FILE (one RUN line each: Dockerfile and %post alike)."""
    return [f"mkdir -p {DPKG_TRIM_FILE.rsplit('/', 1)[0]}",
            "printf '%s\\n' " + " ".join(f"'{line}'" for line in DPKG_TRIM) + f" > {DPKG_TRIM_FILE}"]


def runtime_steps(stack: Stack, pkgs: list[str]) -> list[Step]:
    step = _step(stack, "runtime", "OS packages the image needs at run time (no compilers)", pkgs)
    step.commands = dpkg_trim_commands() + step.commands
    step.notes.append(f"documentation, manual pages and translations left out ({DPKG_TRIM_FILE}); "
                      "licences (/usr/share/doc/*/copyright) kept")
    return [step]


class System(Component):
    def env(self, stack: Stack) -> dict[str, str]:
        # C.UTF-8 ships with glibc: a locale that always exists, so host LANG/LC_* cannot break tools
        # inside (apptainer/singularity#645).
        return {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

    def expect(self, stack: Stack) -> dict:
        # the CPU architecture the image is built for (verify holds the running machine against it)
        arch = {"arch": stack.spec.target_arch}
        lock = stack.lock
        if lock is None:
            return arch
        # OS packages of the final stage, name -> version (for a dpkg drift check)
        stage = "runtime" if "runtime" in lock.apt else "devel"
        return {**arch, "apt": {e["name"]: e["version"] for e in lock.apt.get(stage, [])}}
