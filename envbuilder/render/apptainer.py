"""Plan -> Apptainer/Singularity definition file (multi-stage: `Stage:` blocks)."""

from __future__ import annotations

from dataclasses import replace
import posixpath
import re

from ..emulation import OCI_NAME
from ..plan.image import Copy, Plan, Stage, Step
from ..quoting import apptainer_export, apptainer_line, apptainer_text, image_ref, oci_runscript, shell_words
from .common import CA_SECRET, NETRC_SECRET, WHEELHOUSE, export_line, header, network_setup


# the spec's base_from -> Apptainer's bootstrap agent; an archive is a file of the output folder
ARCHIVES = {"docker-archive": ".docker.tar", "oci-archive": ".oci.tar"}
BASES_FOLDER = "bases"


def archive_name(ref: str, kind: str) -> str:
    """The file, relative to the output folder, that holds the base REF for BOOTSTRAP kind (named
    after the image's name: a locked ref@sha256:... and its tag write the same file)."""
    return f"{BASES_FOLDER}/{re.sub(r'[^A-Za-z0-9._-]+', '_', ref.split('@', 1)[0])}{ARCHIVES[kind]}"


def base_source(ref: str, base_from: str) -> tuple[str, str]:
    """(Bootstrap:, From:) for the base REF. auto: images made locally live only in the Docker
    engine, so Apptainer reads them from the daemon; others come from their registry."""
    if base_from == "auto":
        base_from = "docker-daemon" if ref.startswith("local/") else "registry"
    if base_from in ARCHIVES:
        return base_from, archive_name(ref, base_from)
    return ("docker", ref) if base_from == "registry" else (base_from, ref)


def archive_commands(ref: str, kind: str) -> str:
    """How to write the archive of REF on a machine that has the image (or reaches its registry)."""
    dest = archive_name(ref, kind)
    if kind == "docker-archive":
        return f"docker save {ref} -o {dest}"
    return f"skopeo copy docker-daemon:{ref} oci-archive:{dest}   (from a registry: docker://{ref})"


def _post(steps: list[Step], drop_wheelhouse: bool) -> list[str]:
    lines = ["%post", "    set -eu"]
    for step in steps:
        lines.append(f"    # {step.component}: {apptainer_line(step.title)}")
        lines += [f"    #   {apptainer_line(n)}" for n in step.notes]
        body = []
        if step.build_env:
            body.append(export_line(step.build_env))
        if step.network:
            # the same lines as the Dockerfile's: the site's CA bundle and a private index's login
            # reach %post as files bound at build time (apptainer build --bind), never copied in
            body += network_setup()
        body += step.commands
        lines.append("    (")
        lines += [f"        {apptainer_line(c, f'{step.component} step')}" for c in body]
        lines.append("    )")
    if drop_wheelhouse:
        # a wheelhouse bound at build time (--bind WHEELS:/wheelhouse) is the host's folder: left alone
        lines.append(f"    grep -q ' {WHEELHOUSE} ' /proc/self/mountinfo || rm -rf {WHEELHOUSE}   "
                     "# local wheels were only needed to install")
    if any(step.mounts for step in steps):
        lines.append("    rm -rf /pins   # the lock's pin lists were only needed to install")
    for folder in sorted({m for step in steps for m in step.mounts if not m.startswith("pins/")}):
        lines.append(f"    rm -rf /{folder}   # only needed to install")
    return lines


def _folder_mounts(stage) -> list[str]:
    return sorted({m for i in stage.items if isinstance(i, Step) for m in i.mounts if not m.startswith("pins/")})


def _setup(copies_wheelhouse: bool) -> list[str]:
    """%setup (on the build host, before the host's %files): the bind points of the header's
    `apptainer build --bind` lines, in every stage (Apptainer binds them into each stage's %post
    and %test, and a build cannot create a missing destination). They stay in the image, empty.
    A stage whose %files copies ./wheelhouse gets /wheelhouse from that copy (made here, the copy
    would land inside it)."""
    root = '"${APPTAINER_ROOTFS}"'
    folders = sorted({posixpath.dirname(CA_SECRET), posixpath.dirname(NETRC_SECRET)})
    folders += [] if copies_wheelhouse else [WHEELHOUSE]
    return ["%setup",
            "    # bind points for `apptainer build --bind` (CA bundle, netrc, wheelhouse), empty in the image",
            "    mkdir -p " + " ".join(root + f for f in folders),
            f"    touch {root}{CA_SECRET} {root}{NETRC_SECRET}",
            ""]


def _files(copies: list[Copy]) -> list[str]:
    # a SIF has no layers: a Copy that leaves paths out for layers of their own copies whole here,
    # and the Copies of those paths are dropped
    left_out = {(c.from_stage, p) for c in copies for p in c.without}
    copies = [c for c in copies if (c.from_stage, c.source) not in left_out]
    lines = []
    by_stage: dict = {}
    for c in copies:
        by_stage.setdefault(c.from_stage, []).append(c)
    for stage, items in by_stage.items():
        lines.append("%files" + (f" from {stage}" if stage else ""))
        lines += [f"    {apptainer_line(c.source)} {apptainer_line(c.dest)}" for c in items]
        lines.append("")
    return lines


def _archive_lines(plan: Plan) -> list[str]:
    kinds = {base_source(stage.base, plan.base_from)[0] for stage in plan.stages}
    kind = next((k for k in kinds if k in ARCHIVES), None)
    if kind is None:
        return []
    bases = list(dict.fromkeys(image_ref(stage.base) for stage in plan.stages))
    return [f"Bases from archives in this folder (base_from: {kind}); write them first, where the image is:",
            *(f"  {apptainer_line(archive_commands(ref, kind))}" for ref in bases)]


def _stages_from_images(plan: Plan) -> Plan:
    """A stage the Dockerfile builds FROM an earlier stage (`packages`, there for the layer
    cache) joins that stage here: a definition file's stage bootstraps from an image, and Apptainer
    has no layer cache to spare. The same steps run in the same order, the same folders are copied."""
    stages: list[Stage] = []
    into: dict[str, str] = {}
    for stage in plan.stages:
        items = [replace(i, from_stage=into[i.from_stage]) if isinstance(i, Copy) and i.from_stage in into else i
                 for i in stage.items]
        host = next((s for s in stages if s.name == into.get(stage.base, stage.base)), None)
        if host is None:
            stages.append(Stage(stage.name, stage.base, items, stage.role))
        else:
            host.items += items
            into[stage.name] = host.name
    return replace(plan, stages=stages)


def render_apptainer(plan: Plan, spec_sha: str) -> str:
    plan = _stages_from_images(plan)
    arch = plan.expect.get("arch", "x86_64")
    oci = OCI_NAME.get(arch, arch)
    out = header("#", f"Apptainer/Singularity definition file for {plan.name}", spec_sha, [
        "",
        *([f"Build:  apptainer build {plan.name}.sif Apptainer.def   (runs %test: the smoke suite)"] if arch == "x86_64" else [
            f"Build:  apptainer build --arch {oci} {plan.name}.sif Apptainer.def   (runs %test: the smoke suite)",
            f"  ({arch} image: --arch {oci} takes a multi-arch base's {oci} image, where Apptainer would take",
            "  the build machine's own; on an x86_64 machine %post and %test run under QEMU: qemu-user-static)"]),
        "  (unprivileged, Apptainer builds with --fakeroot: the site must allow user namespaces,",
        "  subordinate ids in /etc/subuid and /etc/subgid, and /dev/fuse)",
        *(["  %test checks the GPU: on a machine without one add --notest, then on a GPU node:",
           f"  apptainer test --nv {plan.name}.sif"] if plan.expect.get("gpu") else []),
        "Binds for %post, never copied into the image (add them before the .sif's name):",
        f"  local wheels (offline sites):      --bind WHEELS_FOLDER:{WHEELHOUSE}:ro",
        "    (or put them in ./wheelhouse/: copied into the build stage only)",
        f"  a TLS-intercepting proxy's CA:     --bind /etc/ssl/certs/ca-certificates.crt:{CA_SECRET}:ro",
        f"  a private pip index's login:       --bind NETRC_FILE:{NETRC_SECRET}:ro",
        f"  e.g. apptainer build{'' if arch == 'x86_64' else ' --arch ' + oci} --bind "
        f"/etc/ssl/certs/ca-certificates.crt:{CA_SECRET}:ro {plan.name}.sif Apptainer.def",
        *_archive_lines(plan),
    ])
    multi = len(plan.stages) > 1
    for stage in plan.stages:
        last = stage is plan.final
        bootstrap, source = base_source(image_ref(stage.base), plan.base_from)
        out += ["", f"Bootstrap: {bootstrap}", f"From: {source}"]
        if multi:
            out.append(f"Stage: {stage.name}")
        out.append("")
        copies = [i for i in stage.items if isinstance(i, Copy)]
        if not last or not multi:
            copies = [Copy("wheelhouse", WHEELHOUSE)] + copies
        if any(i.mounts for i in stage.items if isinstance(i, Step)):
            copies = [Copy("pins", "/pins")] + copies
        # a folder a step bind-mounts in the Dockerfile (conda-pkgs/: the locked conda packages)
        copies = [Copy(m, f"/{m}") for m in _folder_mounts(stage)] + copies
        out += _setup(any(c.dest == WHEELHOUSE for c in copies))
        out += _files(copies)
        out += _post([i for i in stage.items if isinstance(i, Step)], drop_wheelhouse=not multi)
        if not last:
            continue
        out += ["", "%environment"]
        out += [f"    # {k}: {why}" for k, why in plan.env_notes.items()]
        out += [f"    {apptainer_export(k, v, k, expand=k not in plan.literal_env)}" for k, v in plan.env.items()]
        out += ["", "%labels"]
        out += [f"    {apptainer_line(k)} {apptainer_text(v, k)}" for k, v in plan.labels.items()]
        out += ["", "%help"]
        out += [f"    {apptainer_line(line, 'description')}" for line in plan.help.split("\n")]
        # the Dockerfile's CMD, as envbuilder's own .sif runs it: the same lines (quoting.py)
        shell_words(plan.runscript, "runscript")          # refuses what no shell line may hold
        out += ["", "%runscript", *(f"    {line}" for line in oci_runscript([], plan.runscript))]
        out += ["", "%test", f"    {shell_words(plan.test)}"]
    return "\n".join(out) + "\n"
