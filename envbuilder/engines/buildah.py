"""Build with buildah or podman: no daemon, rootless where the user has subordinate ids, and
bit-identical images from one lock.

The same Dockerfile as the Docker engine: the CA bundle goes in as a build secret and the
wheelhouse as a bind mount, so neither lands in a layer. Reproducible by default: every file time
and the image's creation date are set to the lock's own date (``--timestamp``), the build runs
without a layer cache, the locked Dockerfile's steps export a fixed SOURCE_DATE_EPOCH (hash-checked
bytecode) and remove apt's logs and caches. Two builds of one lock then give one image digest.

The image stays in the engine's storage (``buildah images``); ``export_image`` hands it on: to the
Docker engine (``docker-daemon:``), or as an OCI / docker archive, which is what
``apptainer build x.sif oci-archive://FILE`` and charliecloud take on a cluster.

Where the image's digest is recorded: an image cannot hold its own digest (the digest is a hash
over its layers and config), so <folder>/image.json records it after the build, next to the lock
and the manifest the image does hold; ``verify`` and ``diff`` read it from there.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from .. import safewrite
from ..errors import CheckFailed, EnvbuilderError
from ..output import write_atomic
from ..render.manifest import image_tag
from .context import check_inputs, pip_index_conf, platform_of, stage_context
from .options import BuildOptions

MIN_FREE_GB = {False: 6, True: 30}       # a CPU stack / a CUDA stack: layers + one working copy
STEP_RE = re.compile(r"^(?:\[(\d+/\d+)\] )?STEP (\d+/\d+): (.*)$")
FROM_RE = re.compile(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)", re.I | re.M)
EXPORTS = ("docker", "oci-archive", "docker-archive")
ARCHIVE_NAMES = {"oci-archive": "image.oci.tar", "docker-archive": "image.docker.tar"}


class OciEngine:
    """One daemonless engine's command line. buildah and podman differ only in a few verbs."""

    def __init__(self, name: str):
        self.name = name
        self.binary = shutil.which(name)
        if self.binary is None:
            package = "buildah" if name == "buildah" else "podman"
            raise CheckFailed(f"{name} engine", f"{name} is not installed (not on PATH)",
                              f"apt-get install {package} uidmap (Debian/Ubuntu), or use --engine docker")

    def run(self, *args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise CheckFailed(f"{self.name} {args[0]}", (proc.stderr or proc.stdout).strip()[-600:]
                              or f"exit {proc.returncode}", f"run `{self.name} {' '.join(args)}` to see more")
        return proc

    def build_command(self, context: Path, tag: str, ca_bundle: str | None, epoch: int,
                      netrc: str | None = None, platform: str | None = None) -> list[str]:
        verb = ["bud"] if self.name == "buildah" else ["build"]
        # OCI format: the docker format's config names the build container (`container`,
        # `container_config.Hostname`), a random ID that would change the digest of every build.
        # RUN steps still use the Dockerfile's SHELL; only the image config does not keep it.
        cmd = [self.binary, *verb, "--format", "oci",
               "--layers=false", "--no-cache", "--pull=false", "--timestamp", str(epoch), "--tag", tag]
        if os.geteuid() != 0:
            # rootless: RUN steps share the user's network; slirp4netns needs /dev/net/tun, which
            # many machines (this one included) keep root-only
            cmd += ["--network", "host"]
        if platform:
            cmd += ["--platform", platform]     # an aarch64 image: QEMU binfmt on an x86_64 machine
        if ca_bundle:
            cmd += ["--secret", f"id=ca,src={Path(ca_bundle).resolve()}"]
        if netrc:
            cmd += ["--secret", f"id=netrc,src={Path(netrc).resolve()}"]
        return cmd + [str(context)]

    def graph_root(self) -> Path:
        field = "{{.store.GraphRoot}}" if self.name == "buildah" else "{{.Store.GraphRoot}}"
        return Path(self.run("info", "--format", field).stdout.strip())

    def image_id(self, ref: str) -> str | None:
        """The image's ID (sha256 of its config) in this engine's storage, or None."""
        if self.name == "buildah":
            proc = self.run("inspect", "--type", "image", "--format", "{{.FromImageID}}", ref, check=False)
        else:
            proc = self.run("image", "inspect", "--format", "{{.Id}}", ref, check=False)
        out = proc.stdout.strip()
        return ("sha256:" + out.removeprefix("sha256:")) if proc.returncode == 0 and out else None

    def describe(self, ref: str) -> dict:
        """ID, manifest digest, layer digests and size of an image in this engine's storage."""
        if self.name == "buildah":
            data = json.loads(self.run("inspect", "--type", "image", ref).stdout)
            image_id, digest = data["FromImageID"], data["FromImageDigest"]
            config = data.get("Docker") or data.get("OCIv1") or {}
        else:
            data = json.loads(self.run("image", "inspect", ref).stdout)[0]
            image_id, digest = data["Id"], data["Digest"]
            config = {"rootfs": {"diff_ids": data.get("RootFS", {}).get("Layers", [])}, "created": data.get("Created")}
        listing = json.loads(self.run("images", "--format", "json", ref).stdout
                             if self.name == "podman" else self.run("images", "--json", ref).stdout)
        size = listing[0].get("size") if listing else None
        return {"id": "sha256:" + image_id.removeprefix("sha256:"), "digest": digest,
                "layers": list((config.get("rootfs") or {}).get("diff_ids") or []), "config": config,
                "created": config.get("created"), "size_bytes": _bytes(size)}

    def remove(self, ref: str) -> None:
        self.run("rmi", "-f", ref, check=False)


def _bytes(size) -> int | None:
    """buildah prints sizes for people ("1.14 GB"); podman gives bytes."""
    if isinstance(size, (int, float)):
        return int(size)
    m = re.match(r"^([\d.]+)\s*([kMGT]?B)$", str(size or "").strip())
    if not m:
        return None
    return int(float(m.group(1)) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[m.group(2)])


def source_date_epoch(lock) -> int:
    """The lock's own date (``resolved_at``) in seconds: the same for every build of that lock."""
    stamp = getattr(lock, "resolved_at", "")
    if not stamp:
        raise EnvbuilderError("envbuilder.lock", "the lock has no resolved_at date to build reproducibly from",
                              "re-lock: envbuilder lock SPEC")
    when = datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    return int(when.timestamp())


# --- the base image -------------------------------------------------------------------------------

def ensure_base(engine: OciEngine, ref: str, want: str | None) -> str:
    """Make ``ref`` present in the engine's storage: already there; a base pinned by digest
    (``name@sha256:...``: the lock's registry image) pulled from its registry, through the mirrors
    of registries.conf as any containers/image pull; or copied from the Docker engine
    (``docker-daemon:``). Where the lock names a local image ID, the copy must be that image.
    The build itself runs with ``--pull=false``: it never reaches out for its base."""
    have = engine.image_id(ref)
    tried = [f"{engine.name} storage ({engine.graph_root()})"]
    if have is None and "@sha256:" in ref:
        proc = engine.run("pull", "--quiet", ref, check=False, timeout=900)
        tried.append("its registry (or the registries.conf mirror)")
        if proc.returncode == 0:
            have = engine.image_id(ref)
    if have is None:
        proc = engine.run("pull", "--quiet", f"docker-daemon:{ref}", check=False, timeout=900)
        tried.append("the Docker engine (docker-daemon:)")
        if proc.returncode == 0:
            engine.run("tag", proc.stdout.strip().splitlines()[-1], ref)
            have = engine.image_id(ref)
    if have is None:
        raise CheckFailed("base", f"the base image {ref} is in none of: {', '.join(tried)}",
                          f"copy it in: `{engine.name} pull docker-daemon:{ref}` (from Docker), "
                          f"`{engine.name} pull oci-archive:FILE` then `{engine.name} tag IMAGE {ref}`, "
                          f"or `{engine.name} pull {ref}` where its registry is reachable")
    if want and have != want:
        raise CheckFailed("base", f"{ref} is {have[:19]} in {engine.name}'s storage; the lock names {want[:19]}",
                          f"`{engine.name} rmi {ref}` so it is copied again from Docker, or re-lock: "
                          "envbuilder lock SPEC --update base")
    return have


def _bases(dockerfile: str) -> list[str]:
    stages, out = set(), []
    for line in dockerfile.splitlines():
        m = re.match(r"^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            if m.group(1) not in stages and m.group(1) not in out:
                out.append(m.group(1))
            if m.group(2):
                stages.add(m.group(2))
    return out


def storage_driver(engine: OciEngine) -> str:
    """The storage driver the engine uses (overlay, vfs...), as its `info` says."""
    field = "{{.store.GraphDriverName}}" if engine.name == "buildah" else "{{.Store.GraphDriverName}}"
    return engine.run("info", "--format", field).stdout.strip()


def check_disk(engine: OciEngine, gpu: bool, vfs: bool = False) -> None:
    """Room under the storage's graphroot (vfs: every layer a full copy, about three times as much)."""
    root = engine.graph_root()
    probe = root if root.exists() else Path("/")
    while not probe.exists():
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9
    need = MIN_FREE_GB[gpu] * (3 if vfs else 1)
    if free_gb < need:
        raise CheckFailed(f"{engine.name} storage", f"only {free_gb:.1f} GB free under {root}; this build "
                          f"needs about {need} GB" + (" (vfs storage)" if vfs else ""),
                          f"free disk space (`{engine.name} rmi` unused images) or "
                          "point graphroot in storage.conf (CONTAINERS_STORAGE_CONF) at a larger disk")


# --- building -------------------------------------------------------------------------------------

def _failed_step(lines: list[str]) -> str:
    for line in reversed(lines):
        m = re.search(r'(?:error building at|building at) STEP "(.+?)": (.*)$', line)
        if m:
            return f"{m.group(1)[:160]} ({m.group(2)[:80]})"
    steps = [m for m in map(STEP_RE.match, lines) if m]
    if steps:
        return f"[{steps[-1].group(1) or '1/1'}] STEP {steps[-1].group(2)}: {steps[-1].group(3)[:160]}"
    return "the build"


def _run_build(cmd: list[str], log, quiet: bool, env: dict) -> tuple[int, list[str]]:
    lines: list[str] = []
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", env=env)
    for line in proc.stdout:
        log.write(line)
        lines.append(line.rstrip("\n"))
        step = STEP_RE.match(line)
        if step and not quiet:
            print(f"  [{step.group(1) or '1/1'} {step.group(2)}] {step.group(3)[:110]}", file=sys.stderr, flush=True)
    return proc.wait(), lines


def _build_once(engine: OciEngine, context: Path, tag: str, opts: BuildOptions, epoch: int,
                log, stack) -> dict:
    env = dict(os.environ)
    cmd = engine.build_command(context, tag, opts.ca_bundle, epoch, opts.netrc, platform_of(stack))
    started = time.monotonic()
    code, lines = _run_build(cmd, log, opts.quiet, env)
    seconds = time.monotonic() - started
    if code != 0:
        from .buildlog import certificate_failure, explain_build_failure

        full = any("no space left on device" in l.lower() for l in lines[-40:])
        why = explain_build_failure(lines, stack.lock)
        tls = certificate_failure(lines, opts.ca_bundle)
        reason = f"step failed: {_failed_step(lines)}"
        if full:
            reason += f"\n  {engine.name} storage is full ({engine.graph_root()})"
        raise CheckFailed(f"{engine.name} build", reason + (f"\n  lock: {why}" if why else "")
                          + (f"\n  tls: {tls}" if tls else ""), f"the full log is {log.name}")
    info = engine.describe(tag)
    info["build_seconds"] = round(seconds, 1)
    return info


def build(folder: Path, output, opts: BuildOptions) -> dict:
    stack = output.stack
    check_inputs(opts.ca_bundle, opts.wheelhouse)
    if opts.netrc and not Path(opts.netrc).is_file():
        raise EnvbuilderError("--netrc", f"no such file: {opts.netrc}",
                              "give a netrc file: machine HOST login USER password TOKEN")
    for kind in opts.exports:
        if kind not in EXPORTS:
            raise EnvbuilderError("--export", f"unknown target {kind!r}", f"one of {', '.join(EXPORTS)}")
    if "docker" not in stack.spec.targets:
        raise EnvbuilderError("targets", "the spec does not list docker, so there is no Dockerfile to build",
                              "add docker to targets")
    if stack.lock is None:
        raise EnvbuilderError("envbuilder.lock", f"--engine {opts.engine} builds from a lock", "envbuilder lock SPEC")
    engine = OciEngine(opts.engine)
    check_disk(engine, stack.spec.cuda is not None)
    epoch = source_date_epoch(stack.lock)
    dockerfile = output.files["Dockerfile"].decode()
    locked_bases = {e.get("ref"): e.get("digest") for e in (stack.lock.base or {}).values()
                    if e.get("kind") == "image-id"}
    for ref in _bases(dockerfile):
        ensure_base(engine, ref, locked_bases.get(ref))
    tag = opts.tag or image_tag(stack)
    context = stage_context(folder, output.files, opts.wheelhouse, pip_index_conf(opts.index_url, opts.extra_index_urls),
                            opts.skip_wheels)
    log_path = folder / "build.log"
    try:
        with safewrite.open_new(log_path, option="build log", inside=folder) as log:
            first = _build_once(engine, context, tag, opts, epoch, log, stack)
            second = None
            if opts.check_reproducible:
                if not opts.quiet:
                    print(f"  building once more without cache to compare ({first['build_seconds']:.0f} s the first time)",
                          file=sys.stderr, flush=True)
                log.write("\n# envbuilder --check-reproducible: the second build\n")
                second = _build_once(engine, context, tag + "-repro", opts, epoch, log, stack)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    info = {"engine": engine.name, "tag": tag, "id": first["id"], "digest": first["digest"],
            "layers": first["layers"], "created": first["created"], "source_date_epoch": epoch,
            "size_bytes": first["size_bytes"], "build_seconds": first["build_seconds"], "log": str(log_path)}
    if second is not None:
        info["reproducible"] = compare_builds(engine, tag, tag + "-repro", first, second)
        engine.remove(tag + "-repro")
    info["exports"] = {kind: export_image(engine.name, tag, kind, folder) for kind in opts.exports}
    if "docker" in opts.exports:
        # Docker stores the image in its own format: the config is converted (same layers, so
        # the same for every build of the lock), hence Docker's ID for this build
        proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True)
        info["docker_id"] = proc.stdout.strip() or None
    write_atomic(folder / "image.json", json.dumps(info, indent=2) + "\n", option="image.json", inside=folder)
    if not opts.quiet:
        size = f"{info['size_bytes'] / 1e6:.0f} MB, " if info["size_bytes"] else ""
        print(f"built {tag} with {engine.name} ({size}{info['build_seconds']:.0f} s); log {log_path}")
        print(f"  image digest {info['digest']}  id {info['id']}")
        for kind, where in info["exports"].items():
            print(f"  {kind}: {where}")
        rep = info.get("reproducible")
        if rep is not None:
            print(f"  second build: digest {rep['second']['digest']}  id {rep['second']['id']}")
            print("  reproducible: bit-identical" if rep["identical"] else
                  "  NOT reproducible: " + rep["explanation"])
    if info.get("reproducible") and not info["reproducible"]["identical"]:
        raise CheckFailed("--check-reproducible", "two builds of one lock gave different images:\n  "
                          + info["reproducible"]["explanation"].replace("\n", "\n  "),
                          f"the record is {folder / 'image.json'}")
    return info


# --- handing the image on -------------------------------------------------------------------------

def export_image(engine_name: str, tag: str, kind: str, folder: Path) -> str:
    """Copy an image from buildah's/podman's storage to ``kind``; return where it went.

    ``docker``: into the Docker engine under the same tag (``docker-daemon:TAG``).
    ``oci-archive``: <folder>/image.oci.tar, for ``apptainer build x.sif oci-archive://FILE``,
    ``ch-convert -i oci``... ``docker-archive``: <folder>/image.docker.tar (``docker load``,
    ``apptainer build x.sif docker-archive://FILE``). The image keeps the tag given here."""
    binary = shutil.which(engine_name) or engine_name
    private = None
    if kind == "docker":
        dest, where = f"docker-daemon:{tag}", f"docker-daemon:{tag}"
    elif kind in ARCHIVE_NAMES:
        path = folder.resolve() / ARCHIVE_NAMES[kind]
        # written into a folder only this process writes, then moved (never through a link:
        # safewrite.place); a failed export never leaves a half-written archive behind
        private = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
        tmp = private / path.name
        dest, where = f"{kind}:{tmp}:{tag}", str(path)
    else:
        raise EnvbuilderError("--export", f"unknown target {kind!r}", f"one of {', '.join(EXPORTS)}")
    try:
        proc = subprocess.run([binary, "push", "--quiet", tag, dest], capture_output=True, text=True)
        if proc.returncode != 0:
            raise CheckFailed(f"{engine_name} push", f"could not write {where}: {proc.stderr.strip()[-500:]}",
                              "for docker: is the Docker engine running? for archives: is there disk space?")
        if private is not None:
            safewrite.place(private / path.name, path, option="--export", inside=folder.resolve())
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
    return where


# --- comparing two builds -------------------------------------------------------------------------

def compare_builds(engine: OciEngine, tag_a: str, tag_b: str, a: dict, b: dict) -> dict:
    """Both digests; where they differ, the first differing layer and the files that differ in it."""
    out = {"identical": a["id"] == b["id"] and a["digest"] == b["digest"],
           "first": {"digest": a["digest"], "id": a["id"], "build_seconds": a["build_seconds"]},
           "second": {"digest": b["digest"], "id": b["id"], "build_seconds": b["build_seconds"]}}
    if out["identical"]:
        out["explanation"] = "bit-identical"
        return out
    index = next((i for i, (x, y) in enumerate(zip(a["layers"], b["layers"])) if x != y), None)
    if index is None:
        if len(a["layers"]) != len(b["layers"]):
            out["explanation"] = f"different layer counts ({len(a['layers'])} and {len(b['layers'])})"
        else:
            ca, cb = a.get("config") or {}, b.get("config") or {}
            keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
            out["config_differs"] = keys
            out["explanation"] = ("same layers, different image config: " + (", ".join(keys) or "its encoding"))
        return out
    files = layer_file_diff(engine, tag_a, tag_b, index)
    out["first_different_layer"] = {"index": index, "a": a["layers"][index], "b": b["layers"][index]}
    out["files"] = files
    shown = "\n".join(f"{f['path']}: {f['why']}" for f in files[:20])
    more = f"\n... and {len(files) - 20} more" if len(files) > 20 else ""
    out["explanation"] = f"layer {index + 1} of {len(a['layers'])} differs; files:\n{shown}{more}"
    return out


def _members(layer: Path) -> dict[str, tuple]:
    found = {}
    with tarfile.open(layer) as tar:
        for m in tar:
            digest = hashlib.sha256(tar.extractfile(m).read()).hexdigest() if m.isfile() else ""
            found[m.name.lstrip("./")] = (m.type, oct(m.mode), m.uid, m.gid, int(m.mtime), m.size,
                                          m.linkname, digest)
    return found


WHY = ("type", "mode", "owner", "group", "time", "size", "link target", "content")


def layer_file_diff(engine: OciEngine, tag_a: str, tag_b: str, index: int) -> list[dict]:
    """The files that differ between layer ``index`` of two images (uncompressed OCI copies)."""
    with tempfile.TemporaryDirectory(prefix="envbuilder-layers-") as tmp:
        layout = Path(tmp) / "oci"
        layers = []
        for tag, name in ((tag_a, "a"), (tag_b, "b")):
            engine.run("push", "--quiet", "--disable-compression", tag, f"oci:{layout}:{name}")
        index_json = json.loads((layout / "index.json").read_text())
        for name in ("a", "b"):
            desc = next(m for m in index_json["manifests"]
                        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == name)
            manifest = json.loads((layout / "blobs" / "sha256" / desc["digest"].split(":")[1]).read_text())
            layers.append(layout / "blobs" / "sha256" / manifest["layers"][index]["digest"].split(":")[1])
        a, b = _members(layers[0]), _members(layers[1])
    diffs = []
    for path in sorted(set(a) | set(b)):
        if path not in a:
            diffs.append({"path": path, "why": "only in the second build"})
        elif path not in b:
            diffs.append({"path": path, "why": "only in the first build"})
        elif a[path] != b[path]:
            fields = [WHY[i] for i in range(len(WHY)) if a[path][i] != b[path][i]]
            diffs.append({"path": path, "why": ", ".join(fields) + " differ"})
    return diffs
