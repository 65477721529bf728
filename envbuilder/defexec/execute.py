"""Run an output folder's Apptainer.def with rootful buildah, stage by stage, as Apptainer runs it
(apptainer v1.5: internal/pkg/build/stage.go, files/copy.go, metadata.go):

    1. Bootstrap/From: a working container of the base image (docker-daemon: copied from the
       Docker engine into buildah's storage, its ID checked against the lock), with
       /.singularity.d as Apptainer's docker conversion writes it (sif/metadata.py's files)
    2. %files from STAGE: copied from that stage's root, owners, modes and links kept
       (CopyFromStage); then %setup on this host as `/bin/sh -cex` with APPTAINER_ROOTFS set to
       the stage's root (stage.go runs it there); then %files: `cp -fLr SRC DST` from the folder
       (CopyFromHost); missing parent folders are made
    3. %post: the section written to /.post.script and run as `/bin/sh -ex /.post.script` in
       the container, through /.singularity.d/actions/exec (the base's environment), with a
       clean environment, the host's network, `/` as working folder; the CA bundle and netrc
       bound at /run/secrets/{ca,netrc} for that run only (`apptainer build --bind` does the same)
    4. last stage: %environment appended to env/90-environment.sh, %runscript -> runscript,
       %test -> test, %help -> runscript.help, labels.json (the base's labels, Apptainer's build
       labels, %labels), the definition file -> Singularity
    5. committed (one layer over the base): ENTRYPOINT /.singularity.d/actions/exec, CMD its
       runscript, so `docker run IMAGE CMD` is what `apptainer exec x.sif CMD` does

Needs root (buildah mount). Every working container is removed at the end, failed or not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from .. import __version__
from ..errors import CheckFailed, EnvbuilderError
from ..output import write_atomic
from ..sif import metadata
from ..sif.rootfs import ImageConfig
from .deffile import DefStage, parse

DEF_NAME = "Apptainer.def"
RECORD = "defexec.json"
LOG = "defexec.log"
POST_SCRIPT = ".post.script"
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
POST_ENV = {"PATH": CLEAN_PATH, "HOME": "/root",
            "APPTAINER_ENVIRONMENT": "/.singularity.d/env/91-environment.sh",
            "SINGULARITY_ENVIRONMENT": "/.singularity.d/env/91-environment.sh",
            "APPTAINER_LABELS": "/.build.labels", "SINGULARITY_LABELS": "/.build.labels"}
SECRETS = {"ca": "/run/secrets/ca", "netrc": "/run/secrets/netrc"}
# Apptainer's own env/90-environment.sh; the definition's %environment is appended to it
ENV_90 = "#!/bin/sh\n# Custom environment shell code should follow\n"
WRITER = f"envbuilder {__version__} defexec (definition file executed with buildah)"
ENTRYPOINT = "/.singularity.d/actions/exec"


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _inside(root: Path, path: str, what: str) -> Path:
    """PATH of the image under ROOT, its folders resolved inside ROOT (a link never leads out)."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise EnvbuilderError(DEF_NAME, f"{what}: {path!r} climbs out with ..", "use an absolute path in the image")
    here = root
    for i, part in enumerate(parts):
        nxt = here / part
        hops = 0
        while nxt.is_symlink() and i < len(parts) - 1 and hops < 40:
            target = os.readlink(nxt)
            nxt = (root / target.lstrip("/")) if target.startswith("/") else (here / target)
            nxt = Path(os.path.normpath(nxt))
            hops += 1
        if not str(nxt).startswith(str(root)):
            raise EnvbuilderError(DEF_NAME, f"{what}: {path!r} leads out of the image", "use a plain path")
        here = nxt
    return here


def _write(root: Path, rel: str, data: str | bytes, mode: int) -> None:
    path = _inside(root, rel, "metadata")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.is_file():
        path.unlink()
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)


def base_metadata(root: Path, config: ImageConfig) -> None:
    """/.singularity.d as Apptainer's docker conversion leaves it before %files and %post."""
    for folder in metadata.FOLDERS:
        path = _inside(root, folder, "metadata")
        if not path.exists():
            path.mkdir(parents=True, mode=0o755)
    sd = ".singularity.d"
    for name, text in metadata.ACTIONS.items():
        _write(root, f"{sd}/actions/{name}", text, 0o755)
    for name, text in metadata.ENV_FILES.items():
        _write(root, f"{sd}/env/{name}", ENV_90 if name == "90-environment.sh" else text, 0o755)
    _write(root, f"{sd}/env/10-docker2singularity.sh", metadata.docker_env_script(config.env), 0o755)
    _write(root, f"{sd}/runscript", metadata.runscript(config), 0o755)
    _write(root, f"{sd}/startscript", "#!/bin/sh\n", 0o755)
    for name, target in metadata.SYMLINKS.items():
        link = root / name
        if not link.exists() and not link.is_symlink():
            os.symlink(target, link)
    for name in ("etc/hosts", "etc/resolv.conf"):
        path = _inside(root, name, "metadata")
        if not path.exists() and not path.is_symlink():
            path.touch(mode=0o644)


def _script(body: str) -> str:
    """A %runscript/%test as Apptainer writes it (handleShebangScript): its own #! line or /bin/sh."""
    text = body.strip("\n")
    if text.strip().startswith("#!"):
        first, _, rest = text.strip().partition("\n")
        return first.strip() + "\n\n" + rest + "\n"
    return "#!/bin/sh\n\n" + text + "\n"


def final_metadata(root: Path, stage: DefStage, config: ImageConfig, deffile: bytes, epoch: int) -> dict:
    """What Apptainer's insertMetadata adds after %post; returns the labels written."""
    sd = ".singularity.d"
    env = stage.section("environment")
    if env is not None and env.body.strip():
        path = _inside(root, f"{sd}/env/90-environment.sh", "%environment")
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("\n" + env.body + "\n")
    for name, target in (("runscript", "runscript"), ("test", "test")):
        sec = stage.section(name)
        if sec is not None and sec.body.strip():
            _write(root, f"{sd}/{target}", _script(sec.body), 0o755)
    help_ = stage.section("help")
    if help_ is not None and help_.body.strip():
        _write(root, f"{sd}/runscript.help", help_.body + "\n", 0o644)
    labels = metadata.labels(config, stage.bootstrap, stage.source, epoch, WRITER)
    if stage.name:
        labels["org.label-schema.usage.singularity.deffile.stage"] = stage.name
    if help_ is not None and help_.body.strip():
        labels["org.label-schema.usage"] = f"/{sd}/runscript.help"
    labels.update(stage.labels())
    labels = dict(sorted(labels.items()))
    _write(root, f"{sd}/labels.json", json.dumps(labels, indent="\t"), 0o644)
    _write(root, f"{sd}/Singularity", deffile, 0o644)
    return labels


# --- the engine side ------------------------------------------------------------------------------

class Run:
    """One execution: the engine, the log, the working containers (removed at the end)."""

    def __init__(self, engine, log, quiet: bool):
        self.engine = engine
        self.log = log
        self.quiet = quiet
        self.containers: dict[str, tuple[str, Path]] = {}      # stage name -> (container, mount)

    def buildah(self, *args: str, step: str) -> str:
        self.log.write("$ buildah " + " ".join(args) + "\n")
        proc = subprocess.run([self.engine.binary, *args], capture_output=True, text=True)
        self.log.write(proc.stdout + proc.stderr)
        self.log.flush()
        if proc.returncode != 0:
            raise CheckFailed(f"definition file: {step}", (proc.stderr or proc.stdout).strip()[-600:]
                              or f"buildah {args[0]} exit {proc.returncode}", f"the full log is {self.log.name}")
        return proc.stdout.strip()

    def remove(self, name: str) -> None:
        ctr, _ = self.containers.pop(name)
        self.log.write(f"$ buildah rm {ctr}   # stage {name}: no later stage copies from it\n")
        subprocess.run([self.engine.binary, "rm", ctr], capture_output=True)

    def cleanup(self) -> None:
        for ctr, _ in self.containers.values():
            subprocess.run([self.engine.binary, "rm", ctr], capture_output=True)
        self.containers.clear()


def _base_config(run: Run, ref: str, step: str) -> ImageConfig:
    data = json.loads(run.buildah("inspect", "--type", "image", ref, step=step))
    oci = data.get("OCIv1") or {}
    return ImageConfig.from_json({"architecture": oci.get("architecture") or "amd64",
                                  "config": oci.get("config") or {}}, ref)


def _destination(dst_root: Path, dst: str, where: str) -> Path:
    """DST inside the stage's root, its folder made as Apptainer makes it: DST itself when it ends
    with '/', else its parent."""
    dest = _inside(dst_root, dst, where)
    (dest if dst.endswith("/") else dest.parent).mkdir(parents=True, exist_ok=True)
    return dest


def _copy_from_stage(run: Run, src_root: Path, dst_root: Path, src: str, dst: str, where: str) -> None:
    """Apptainer's CopyFromStage: the source resolved inside its stage (a link named itself is
    followed, links below it are copied as links), into DST (or DST/name when DST is a folder)."""
    source = _inside(src_root, src, where)
    if source.is_symlink():
        target = os.readlink(source)
        source = _inside(src_root, target if target.startswith("/") else str(Path(src).parent / target), where)
    if not source.exists():
        raise CheckFailed(f"definition file: {where}", f"{src} does not exist in that stage",
                          "the stage's %post did not make it: see the log")
    dest = _destination(dst_root, dst, where)
    if dest.is_dir():
        dest = dest / Path(src.rstrip("/")).name
    _cp(run, ["cp", "-a", str(source), str(dest)], where)


def _copy_from_host(run: Run, context: Path, dst_root: Path, src: str, dst: str, where: str) -> None:
    """Apptainer's CopyFromHost: `cp -fLr SRC DST` (links followed), SRC relative to the folder."""
    source = (context / src) if not src.startswith("/") else Path(src)
    if not source.exists():
        raise CheckFailed(f"definition file: {where}", f"{src} is not in the output folder",
                          "write the folder again: envbuilder build SPEC --no-build")
    dest = _destination(dst_root, dst, where)
    _cp(run, ["cp", "-fLr", str(source), str(dest)], where)


def _cp(run: Run, argv: list[str], where: str) -> None:
    run.log.write("$ " + " ".join(argv) + "\n")
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CheckFailed(f"definition file: {where}", proc.stderr.strip()[-600:], f"the full log is {run.log.name}")


def _setup(run: Run, root: Path, body: str, stage: str) -> None:
    """%setup: on this host, `/bin/sh -cex BODY` with the stage's root in APPTAINER_ROOTFS."""
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
           "APPTAINER_ROOTFS": str(root), "SINGULARITY_ROOTFS": str(root)}
    proc = subprocess.run(["/bin/sh", "-cex", body], env=env, capture_output=True, text=True)
    run.log.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise CheckFailed(f"definition file: %setup of stage {stage}",
                          f"/bin/sh -cex exited {proc.returncode}: {proc.stderr.strip()[-300:]}",
                          f"the full log is {run.log.name}")


def _post(run: Run, ctr: str, root: Path, body: str, stage: str, secrets: dict[str, str]) -> float:
    """%post: /bin/sh -ex /.post.script through the exec action, output streamed to the log."""
    script = root / POST_SCRIPT
    script.write_text(body + "\n")
    os.chmod(script, 0o755)
    run_dir = root / "run" / "secrets"
    had_secrets = run_dir.exists() or run_dir.is_symlink()
    argv = [run.engine.binary, "run", "--network", "host", "--workingdir", "/"]
    for k, v in POST_ENV.items():
        argv += ["--env", f"{k}={v}"]
    for name, path in secrets.items():
        argv += ["--volume", f"{Path(path).resolve()}:{SECRETS[name]}:ro"]
    argv += [ctr, "--", ENTRYPOINT, "/bin/sh", "-ex", f"/{POST_SCRIPT}"]
    run.log.write("$ " + " ".join(argv) + "\n")
    run.log.flush()
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    last = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        run.log.write(line)
        if line.startswith("+ "):
            last = line[2:].rstrip("\n")
    code = proc.wait()
    run.log.flush()
    script.unlink(missing_ok=True)
    if not had_secrets:
        shutil.rmtree(run_dir, ignore_errors=True)          # mount points the bind left behind
    if code != 0:
        raise CheckFailed(f"definition file: %post of stage {stage}",
                          f"/bin/sh -ex exited {code}; the last command: {last[:300] or '(none traced)'}",
                          f"the full log is {run.log.name}")
    return time.monotonic() - started


def _context(folder: Path, stages: list[DefStage], wheelhouse: str | None) -> Path:
    """The %files sources of the folder in a temporary build folder, plus --wheelhouse's wheels
    (linked into wheelhouse/, never into the output folder), as for the Dockerfile's build."""
    from ..engines.context import stage_context

    files: dict[str, bytes] = {}
    for stage in stages:
        for src_stage, pairs in stage.files():
            if src_stage:
                continue
            for src, _ in pairs:
                path = folder / src
                if path.is_dir():
                    for f in sorted(path.rglob("*")):
                        if f.is_file() and "__pycache__" not in f.parts:
                            files[f.relative_to(folder).as_posix()] = f.read_bytes()
                elif path.is_file():
                    files[src] = path.read_bytes()
    return stage_context(folder, files, wheelhouse)


def _locked_bases(folder: Path) -> tuple[dict[str, str], int]:
    """{base ref: image ID the lock names} and the lock's date (0 without a lock)."""
    path = folder / "envbuilder.lock"
    if not path.is_file():
        return {}, int(time.time())
    from ..engines.buildah import source_date_epoch
    from ..lock.model import load

    lock = load(path)
    bases = {e.get("ref"): e.get("digest") for e in (lock.base or {}).values() if e.get("kind") == "image-id"}
    return bases, source_date_epoch(lock)


def execute(folder: Path, *, tag: str, ca_bundle: str | None = None, netrc: str | None = None,
            wheelhouse: str | None = None, export_docker: bool = False, quiet: bool = False) -> dict:
    """Execute FOLDER/Apptainer.def with buildah; commit the last stage as TAG; return the record
    (also written to FOLDER/defexec.json)."""
    from ..engines.buildah import OciEngine, check_disk, ensure_base, export_image
    from ..engines.context import check_inputs

    path = folder / DEF_NAME
    if not path.is_file():
        raise EnvbuilderError("FOLDER", f"{folder} has no {DEF_NAME}",
                              "give an output folder of `envbuilder build` whose spec lists apptainer in targets")
    deffile = path.read_bytes()
    stages = parse(deffile.decode("utf-8", errors="replace"), str(path))
    check_inputs(ca_bundle, wheelhouse)
    if netrc and not Path(netrc).is_file():
        raise EnvbuilderError("--netrc", f"no such file: {netrc}", "give a netrc file: machine HOST login USER password TOKEN")
    if os.geteuid() != 0:
        raise EnvbuilderError("defexec", "executing the definition file needs root (it mounts the working "
                              "containers with `buildah mount` to copy %files as Apptainer does)",
                              "run it as root; as a user, build the Dockerfile instead: envbuilder build SPEC --engine podman")
    engine = OciEngine("buildah")
    check_disk(engine, b"nvidia" in deffile)
    bases, epoch = _locked_bases(folder)
    secrets = {k: v for k, v in (("ca", ca_bundle), ("netrc", netrc)) if v}
    context = _context(folder, stages, wheelhouse)
    log_path = folder / LOG
    timings: list[dict] = []
    started = time.monotonic()
    names = [s.name or f"stage{i + 1}" for i, s in enumerate(stages)]
    with open(log_path, "w", encoding="utf-8") as log:
        run = Run(engine, log, quiet)
        try:
            for i, stage in enumerate(stages):
                name = names[i]
                where = f"[{name} {i + 1}/{len(stages)}]"
                t0 = time.monotonic()
                ref = stage.source
                if stage.bootstrap.lower() == "docker-daemon":
                    ensure_base(engine, ref, bases.get(ref))
                elif engine.image_id(ref) is None:
                    raise CheckFailed(f"definition file: Bootstrap of stage {name}",
                                      f"{ref} is not in buildah's storage (no registry is asked)",
                                      f"`buildah pull {ref}` where its registry is reachable")
                _say(quiet, f"  {where} Bootstrap: {stage.bootstrap} From: {ref}")
                ctr = run.buildah("from", "--pull=false", "--name", f"envbuilder-defexec-{uuid.uuid4().hex[:10]}",
                                  ref, step=f"Bootstrap of stage {name}").splitlines()[-1]
                root = Path(run.buildah("mount", ctr, step=f"Bootstrap of stage {name}").splitlines()[-1])
                run.containers[name] = (ctr, root)
                config = _base_config(run, ref, f"Bootstrap of stage {name}")
                base_metadata(root, config)
                files = sorted(stage.files(), key=lambda f: f[0] == "")
                for src_stage, pairs in [f for f in files if f[0]]:
                    label = f"%files from {src_stage}"
                    _say(quiet, f"  {where} {label}: " + ", ".join(f"{s} -> {d}" for s, d in pairs))
                    for src, dst in pairs:
                        _copy_from_stage(run, run.containers[src_stage][1], root, src, dst, f"{label} ({src})")
                setup = stage.section("setup")
                if setup is not None and setup.body.strip():
                    _say(quiet, f"  {where} %setup: /bin/sh -cex on this host, APPTAINER_ROOTFS={root}")
                    _setup(run, root, setup.body, name)
                for _, pairs in [f for f in files if not f[0]]:
                    _say(quiet, f"  {where} %files: " + ", ".join(f"{s} -> {d}" for s, d in pairs))
                    for src, dst in pairs:
                        _copy_from_host(run, context, root, src, dst, f"%files ({src})")
                # a stage no later stage copies from is done with: its container goes now (disk)
                for done in [n for n in run.containers if n != name
                             and not any(src == n for later in stages[i + 1:] for src, _ in later.files())]:
                    run.remove(done)
                post = stage.section("post")
                post_s = 0.0
                if post is not None and post.body.strip():
                    _say(quiet, f"  {where} %post: /bin/sh -ex (log {log_path})")
                    post_s = _post(run, ctr, root, post.body, name, secrets)
                timings.append({"stage": name, "seconds": round(time.monotonic() - t0, 1), "post_seconds": round(post_s, 1)})
            final = stages[-1]
            ctr, root = run.containers[names[-1]]
            labels = final_metadata(root, final, config, deffile, epoch)
            cfg = ["config", "--entrypoint", json.dumps([ENTRYPOINT]), "--cmd", "/.singularity.d/runscript"]
            for key, value in final.labels().items():
                cfg += ["--label", f"{key}={value}"]
            run.buildah(*cfg, ctr, step="commit")
            run.buildah("commit", "--quiet", "--format", "oci", "--timestamp", str(epoch), ctr, tag, step="commit")
        finally:
            run.cleanup()
            shutil.rmtree(context, ignore_errors=True)
    info = engine.describe(tag)
    record = {"engine": "buildah", "what": "definition file executed with buildah", "definition": str(path),
              "tag": tag, "id": info["id"], "digest": info["digest"], "size_bytes": info["size_bytes"],
              "seconds": round(time.monotonic() - started, 1), "stages": timings, "labels": labels,
              "log": str(log_path)}
    if export_docker:
        record["exports"] = {"docker": export_image("buildah", tag, "docker", folder)}
        # Docker keeps the image under its own ID (the config converted): what `verify` sees there
        proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True)
        record["docker_id"] = proc.stdout.strip() or None
    write_atomic(folder / RECORD, json.dumps(record, indent=2) + "\n")
    return record
