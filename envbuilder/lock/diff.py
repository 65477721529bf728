"""Compare two locks or two manifests (files, output folders, or images' manifests):
what was added, removed, or changed version."""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckFailed, EnvbuilderError
from ..jsonfile import loads_bounded, read_bounded
from ..manifest_shape import check_manifest, parse_manifest
from ..paths import MANIFEST_IN_IMAGE
from .model import LOCK_NAME, MAX_LOCK_BYTES, MAX_LOCK_DEPTH, MAX_LOCK_VALUES, SCHEMA, LockError, canonical_name, from_data

_FIX = "give envbuilder.lock or manifest.json (a lock, a manifest, an output folder or an image reference)"


def _manifest_flat(data: dict) -> dict[str, str]:
    exp = data.get("expect") or {}
    out = {}
    fw = exp.get("framework") or {}
    if fw:
        out[f"framework:{fw.get('name')}"] = str(fw.get("version"))
    for key in ("python", "cuda", "cudnn", "nccl"):
        if exp.get(key):
            out[key] = str(exp[key])
    if exp.get("horovod"):
        hv = exp["horovod"]
        out["horovod"] = f"{hv.get('version')} ({','.join(hv.get('operations') or [])})"
    if exp.get("mpi"):
        out[f"mpi:{exp['mpi'].get('flavor')}"] = str(exp["mpi"].get("version"))
    for name, version in (exp.get("packages") or {}).items():
        out[f"pip:{canonical_name(name)}"] = str(version)
    for name, version in (exp.get("apt") or {}).items():
        out[f"apt:{name}"] = str(version)
    for name, version in (exp.get("conda") or {}).items():
        out[f"conda:{name}"] = str(version)
    image = data.get("image") or {}
    if image.get("base"):
        out["base"] = image["base"]
    for stage, digest in ((data.get("lock") or {}).get("base") or {}).items():
        out[f"base:{stage}"] = digest
    return out


def _image_manifest(ref: str, connect) -> dict:
    try:
        client = connect()
        raw = client.containers.run(ref, ["cat", MANIFEST_IN_IMAGE], entrypoint=[],
                                    remove=True, stdout=True, stderr=False)
    except Exception as exc:  # no engine, no such image, no manifest in it
        raise CheckFailed(ref, f"cannot read {MANIFEST_IN_IMAGE} from image {ref} ({type(exc).__name__})",
                          "give an image built by envbuilder, with the Docker engine running") from None
    return parse_manifest(raw.decode("utf-8", errors="replace"), ref, f"{ref}:{MANIFEST_IN_IMAGE}")


def load_any(what: str, connect) -> tuple[str, dict[str, str]]:
    """(kind, flat entries) of a lock file, a manifest file, a folder holding either, or an image
    (read through CONNECT(), a Docker client factory handed in: engines.docker.engine)."""
    path = Path(what)
    if path.is_dir():
        if (path / LOCK_NAME).is_file():
            path = path / LOCK_NAME
        elif (path / "manifest.json").is_file():
            path = path / "manifest.json"
        else:
            raise EnvbuilderError(what, f"has neither {LOCK_NAME} nor manifest.json",
                                  "give a lock, a manifest, an output folder or an image reference")
    if path.is_file():
        # bounded: a lock or a manifest is at most MAX_LOCK_BYTES, nested at most MAX_LOCK_DEPTH
        text = read_bounded(path, what, MAX_LOCK_BYTES, _FIX)
        data = loads_bounded(text, what, max_depth=MAX_LOCK_DEPTH, max_values=MAX_LOCK_VALUES, fix=_FIX,
                             source=str(path))
        if isinstance(data, dict) and data.get("schema") == SCHEMA:
            try:
                return "lock", from_data(data, str(path)).flat()
            except LockError as exc:
                raise EnvbuilderError(exc.field, exc.reason, exc.fix, source=exc.source) from None
        if isinstance(data, dict) and "expect" in data:
            return "manifest", _manifest_flat(check_manifest(data, what, str(path)))
        raise EnvbuilderError(what, "is neither a lock nor a manifest", "give envbuilder.lock or manifest.json")
    if ":" in what or "/" in what:
        return "image", _manifest_flat(_image_manifest(what, connect))
    raise EnvbuilderError(what, "no such file, folder or image", "give a lock, a manifest, a folder or an image")


def image_identity(what: str) -> dict | None:
    """{id, digest, where} of an image: an output folder's record of its build (image.json), or
    an image reference the Docker engine (or buildah's storage) holds. None when neither."""
    path = Path(what)
    record = path / "image.json" if path.is_dir() else None
    if record is not None and record.is_file():
        try:
            data = loads_bounded(read_bounded(record, what, 1024 * 1024, _FIX), what, max_depth=8,
                                 max_values=10_000, fix=_FIX)
        except EnvbuilderError:
            return None
        if not isinstance(data, dict) or not all(isinstance(data.get(k), (str, type(None)))
                                                 for k in ("id", "docker_id", "digest")):
            return None
        ids = [i for i in (data.get("id"), data.get("docker_id")) if i]
        return {"id": data.get("id"), "ids": ids, "digest": data.get("digest"), "where": str(record)} if ids else None
    if path.exists() or not (":" in what or "/" in what):
        return None
    import shutil
    import subprocess

    for probe in (["docker", "image", "inspect", "--format", "{{.Id}}", what],
                  ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", what]):
        if shutil.which(probe[0]):
            proc = subprocess.run(probe, capture_output=True, text=True)
            if proc.returncode == 0 and proc.stdout.strip():
                image_id = "sha256:" + proc.stdout.strip().removeprefix("sha256:")
                return {"id": image_id, "ids": [image_id], "digest": None, "where": probe[0]}
    return None


def identity_line(a: dict | None, b: dict | None) -> str | None:
    """"bit-identical" when two images have one ID (the hash of a config that lists every layer's
    hash), else how they differ; None when either side is no image."""
    if not a or not b:
        return None
    same = set(a["ids"]) & set(b["ids"])       # an output folder's record also knows Docker's ID of its image
    if same:
        return f"images: bit-identical (id {sorted(same)[0]})"
    return f"images: not bit-identical (id {a['id']} vs {b['id']})"


def compare(a: dict[str, str], b: dict[str, str]) -> dict:
    added = {k: b[k] for k in sorted(set(b) - set(a))}
    removed = {k: a[k] for k in sorted(set(a) - set(b))}
    changed = {k: {"from": a[k], "to": b[k]} for k in sorted(set(a) & set(b)) if a[k] != b[k]}
    return {"added": added, "removed": removed, "changed": changed,
            "same": len([k for k in set(a) & set(b) if a[k] == b[k]])}


def table(result: dict) -> str:
    rows = [("", "entry", "A", "B")]
    rows += [("~", k, v["from"], v["to"]) for k, v in result["changed"].items()]
    rows += [("+", k, "", v) for k, v in result["added"].items()]
    rows += [("-", k, v, "") for k, v in result["removed"].items()]
    if len(rows) == 1:
        return f"no differences ({result['same']} entries the same)\n"
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2].ljust(widths[2]), r[3]]).rstrip()
             for r in rows]
    lines.append(f"{len(result['changed'])} changed, {len(result['added'])} added, "
                 f"{len(result['removed'])} removed, {result['same']} the same")
    return "\n".join(lines) + "\n"
