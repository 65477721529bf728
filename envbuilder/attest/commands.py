"""What `envbuilder verify --attest`, `envbuilder attest sign|check|provenance` do; cli.py parses
the arguments and calls these with plain values."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import EXIT_OK, EnvbuilderError
from ..jsonfile import check_shape, loads_bounded
from .. import safewrite
from ..output import write_atomic
from . import bounded, check, cosign, sifsign
from .keys import check_key
from .statement import PROVENANCE_PREDICATE, dumps, provenance_statement, verify_statement, why_not_passing
from .subject import (file_subject, fingerprint, is_file_image, registry_config_digest,
                      stable_file_sha256, subject_for)

FORMATS = ("auto", "cosign", "apptainer", "registry")


FIX_MANIFEST = "give the manifest.json `envbuilder build` wrote (build the folder again if it was changed)"
_TEXT = {"type": ["string", "null"]}
# what attest reads of a manifest (statement.py stack_id, verify_statement, provenance_statement):
# each field of the type it is used as, or absent
MANIFEST_SHAPE = {
    "type": "object",
    "description": "a JSON object (the manifest build wrote)",
    "properties": {
        "name": {**_TEXT, "description": "the image's name (text)"},
        "spec_sha256": {**_TEXT, "description": "64 hex digits (text)"},
        "spec": {"type": ["object", "null"], "description": "the spec (an object)"},
        "lock": {"type": ["object", "null"], "description": "the lock's record (an object)",
                 "properties": {"sha256": {**_TEXT, "description": "64 hex digits (text)"}}},
        "expect": {"type": ["object", "null"], "description": "what the image should hold (an object)"},
        "image": {"type": ["object", "null"], "description": "the image's record (an object)"},
    },
}
IMAGE_RECORD_SHAPE = {
    "type": "object",
    "description": "a JSON object (the image.json build wrote)",
    "properties": {k: {"type": ["string", "null"], "description": "text"} for k in ("tag", "id", "digest", "engine")},
}


def _json_file(path: Path, field: str, shape: dict, missing: str) -> dict:
    """A manifest or image record, read once, bounded (size, depth, count), its fields typed:
    one message naming the file and the field, exit 2, never a traceback."""
    text = bounded.read_text(path, field) if path.is_file() else None
    if text is None:
        raise EnvbuilderError(field, missing, FIX_MANIFEST)
    data = loads_bounded(text, field, max_depth=64, max_values=1_000_000, fix=FIX_MANIFEST, source=str(path))
    check_shape(data, shape, field, fix=FIX_MANIFEST, source=str(path))
    return data


def _manifest(path: Path | None) -> dict:
    if path is None or not path.is_file():
        raise EnvbuilderError("--attest", "verify ran without a manifest.json, so the stack is unknown",
                              "verify the output folder of envbuilder build (FOLDER or --manifest)")
    return _json_file(path, "manifest.json", MANIFEST_SHAPE, f"{path} does not exist")


def check_manifest(manifest: dict, source: str = "manifest.json") -> dict:
    """A manifest already read (verify's): the same field types as _manifest checks."""
    check_shape(manifest, MANIFEST_SHAPE, "manifest.json", fix=FIX_MANIFEST, source=source)
    return manifest


def check_out_path(out: str) -> None:
    p = Path(out)
    if p.is_dir() or out.endswith("/"):
        raise EnvbuilderError("--attest", f"{out} is a folder; --attest writes one file",
                              "give a file path, e.g. --attest x.sif.att.json")


def snapshot_subject(image: str | None) -> tuple[dict, tuple[int, ...] | None] | None:
    """What verify is about to run, taken BEFORE the run: a file's sha256 (hashed through one
    descriptor, unchanged while hashed) and its fingerprint; an engine image's ID. None: no image,
    or nothing to hash (a folder image)."""
    if not image:
        return None
    if is_file_image(image):
        if not Path(image).is_file():
            return None
        fp = fingerprint(image)
        subject = file_subject(image)
        return (subject, fp) if fingerprint(image) == fp else None
    try:
        return image_subject_or_none(image), None
    except EnvbuilderError:
        return None


def image_subject_or_none(image: str) -> dict:
    from .subject import image_subject

    return image_subject(image)


def attest_after_verify(report: dict, image: str | None, manifest_path: Path | None, out: str, *,
                        site: str | None = None, nodes: int = 1, manifest: dict | None = None,
                        before: tuple[dict, tuple[int, ...] | None] | None = None) -> str:
    """The statement of a passing verify, written to OUT; a failed or partial verify writes
    nothing and says why (the verify's own exit code stays 1). MANIFEST: the one verify compared
    with (a SIF's own, when no folder was given); else read from MANIFEST_PATH. BEFORE: the
    subject taken before the run (snapshot_subject): the image must be unchanged since, so the
    statement names the bytes that ran, not a file put there after."""
    problem = why_not_passing(report)
    if problem:
        return f"no attestation written: {problem}"
    if not image:
        return "no attestation written: verify ran on the host, not an image"
    if not manifest:
        manifest = _manifest(manifest_path)
    else:
        check_manifest(manifest, str(manifest_path or "manifest.json"))
    if before is not None:
        subject, fp = before
        try:
            now = fingerprint(image) if fp is not None else None
        except OSError:
            now = None
        if fp is not None and now != fp:
            return f"no attestation written: {image} changed while verify ran (size, time or inode differ)"
        if fp is None and subject_for(image) != subject:
            return f"no attestation written: {image} names another image than the one verify ran"
    else:
        subject = subject_for(image)
    statement = verify_statement(report, manifest, subject, site=site, nodes=nodes)
    write_atomic(out, dumps(statement))
    return f"attestation: {out} (subject sha256:{statement['subject'][0]['digest']['sha256'][:12]}..., " \
           f"stack {statement['predicate']['stack']['id'][:17]}...; sign it: envbuilder attest sign {out} --key KEY)"


def _form(image: str, fmt: str, attestation: str | None) -> str:
    if fmt != "auto":
        return fmt
    if "@sha256:" in image and not Path(image).exists():
        return "registry"
    if attestation or Path(f"{image}.att.json").exists():
        return "cosign"
    return "apptainer"


def sign(statement_path: str, key: str, image: str, fmt: str = "auto") -> str:
    """Read once, check those bytes, use those bytes: the statement is read once; what is checked
    (a passing verify, its subject = this image) and what is signed are those bytes, handed to
    cosign / apptainer as a private copy. The bundle is made in a private folder and put beside
    the statement by rename, never written through a link planted at its path."""
    fmt = _form(image, fmt, statement_path)
    keyp = check_key(key, private=True)
    text = bounded.read_text(statement_path, "STATEMENT")
    statement = bounded.parse(text, "STATEMENT", statement_path)
    is_provenance = statement.get("predicateType") == PROVENANCE_PREDICATE
    if is_provenance and fmt == "apptainer":
        # the SIF's signed group holds the verify attestation the job gate reads; a second JSON
        # object there would be a second candidate for it
        raise EnvbuilderError("--format", "a build provenance is signed beside the SIF, not inside it",
                              "use --format cosign (a bundle beside it) or registry")
    if not is_provenance and statement["predicate"].get("result") != "passed":
        raise EnvbuilderError("STATEMENT", f"{statement_path} is no passing verify attestation",
                              "attest a passing verify (envbuilder verify --attest), or give "
                              "FOLDER/provenance.intoto.json")
    subject = statement["subject"][0]["digest"]["sha256"]
    if fmt == "cosign":
        if not Path(image).is_file():
            raise EnvbuilderError("--image", f"{image} is not a file", "give the .sif verify ran")
        _same_subject(image, stable_file_sha256(image), subject, statement_path)
        bundle = Path(f"{statement_path}.bundle")
        safewrite.precheck(bundle, option="attest sign")     # a link or folder there: refused before signing
        with bounded.private_dir() as tmp:
            copy = bounded.private_copy(tmp, "statement.json", text)
            cosign.sign_blob(copy, keyp, tmp / "statement.json.bundle")
            # never through a link, never over a folder (output.write_atomic: safewrite)
            write_atomic(bundle, (tmp / "statement.json.bundle").read_bytes(), option="attest sign")
        if is_provenance:
            return (f"signed: {bundle} (cosign bundle of the build provenance; check: cosign verify-blob --key PUB "
                    f"--bundle {bundle} --insecure-ignore-tlog=true {statement_path})")
        return f"signed: {bundle} (cosign bundle of {statement_path}; check: envbuilder attest check --image {image} --key PUB)"
    if fmt == "apptainer":
        return _sign_in_sif(Path(image), text, subject, statement_path, keyp)
    # registry: cosign attest puts the predicate on the manifest digest; `verified` keeps the
    # image verify ran (its ID, which the pushed manifest's config digest is)
    if "@sha256:" not in image:
        raise EnvbuilderError("--image", f"{image} names no digest", "give REPO@sha256:DIGEST (build --push prints it)")
    # the digest must be tied to the statement's image: never signed on trust
    local = registry_config_digest(image)
    _same_subject(image, local, subject, statement_path, what="image ")
    predicate = dict(statement["predicate"])
    predicate["verified"] = statement["subject"][0]
    with bounded.private_dir() as tmp:
        pred = bounded.private_copy(tmp, "predicate.json", json.dumps(predicate, indent=1))
        cosign.attest(image, pred, statement["predicateType"], keyp)
    return f"attested: {image} (cosign attestation in the registry)"


def _same_subject(image: str, actual: str, subject: str, statement_path: str, what: str = "") -> None:
    if actual != subject:
        raise EnvbuilderError("--image", f"digest differs: {image} is {what}sha256:{actual}, {statement_path} "
                              f"is of sha256:{subject}", "sign the attestation of this image")


def _sign_in_sif(image: Path, text: str, subject: str, statement_path: str, keyp: Path) -> str:
    """The apptainer form: the SIF is copied into a private folder beside it (one read); that copy
    is hashed, checked against the statement's subject, given the statement (the bytes read once)
    and signed; then renamed over the SIF. What is signed is exactly what was checked."""
    if not image.is_file():
        raise EnvbuilderError("--image", f"{image} is not a file", "give the .sif verify ran")
    real = Path(os.path.realpath(image))
    try:
        work = Path(tempfile.mkdtemp(prefix=".envbuilder-sign-", dir=real.parent))
    except OSError as exc:
        raise EnvbuilderError("--image", f"cannot write in {real.parent}: {exc.strerror or exc}",
                              "sign a copy of the SIF in a folder you can write to") from None
    try:
        os.chmod(work, 0o700)
        copy = work / real.name
        try:
            with open(real, "rb") as src, open(copy, "xb") as dst:
                mode = os.fstat(src.fileno()).st_mode & 0o777
                shutil.copyfileobj(src, dst, 1 << 20)
        except OSError as exc:
            raise EnvbuilderError("--image", f"cannot copy {image}: {exc.strerror or exc}",
                                  "sign a copy of the SIF in a folder you can write to") from None
        _same_subject(str(image), stable_file_sha256(copy), subject, statement_path)
        att = bounded.private_copy(work, "statement.json", text)
        sifsign.add_and_sign(copy, att, keyp)
        os.chmod(copy, mode)
        safewrite.place(copy, real, option="--image")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return f"signed: {image} (attestation in its signed group; check: apptainer verify --key PUB {image})"


def run_check(image: str, keys: list[str], *, fmt: str = "auto", attestation: str | None = None,
              bundle: str | None = None, stack: str | None = None, folder: str | None = None,
              pulled: str | None = None) -> check.Passed:
    if folder and not stack:
        from .statement import stack_id

        stack = stack_id(_manifest(Path(folder) / "manifest.json"))
    fmt = _form(image, fmt, attestation)
    if fmt == "cosign":
        return check.check_file(image, keys, attestation, bundle, stack)
    if fmt == "apptainer":
        return check.check_signed_sif(image, keys, stack)
    return check.check_registry(image, keys, stack, pulled)


def provenance(folder: str, out: str | None = None, image: dict | None = None,
               by_build: bool = False) -> str | None:
    """FOLDER/provenance.intoto.json (or OUT): the build's inputs and the image it made. IMAGE:
    the build's record (`build` hands it over; else FOLDER/image.json). Called by `build`, a
    folder without an image (no record, no .sif) gives None; called alone, one message."""
    f = Path(folder)
    manifest = _manifest(f / "manifest.json")
    files = {name: stable_file_sha256(f / name, "provenance") for name in ("Dockerfile", "Apptainer.def", "envbuilder.lock")
             if (f / name).is_file()}
    record_path = f / "image.json"
    if image is None:
        image = (_json_file(record_path, "image.json", IMAGE_RECORD_SHAPE, f"{record_path} does not exist")
                 if record_path.is_file() else {})
    sif = next(iter(sorted(f.glob("*.sif"))), None)
    if sif is not None:
        subject = file_subject(sif)
    elif image.get("id"):
        subject = {"name": image.get("tag") or manifest.get("name"),
                   "digest": {"sha256": str(image["id"]).removeprefix("sha256:")}}
    elif by_build:
        return None
    else:
        raise EnvbuilderError("provenance", f"{folder} holds no built image (no image.json, no .sif)",
                              "build it first: envbuilder build SPEC")
    statement = provenance_statement(manifest, files, image, subject)
    target = Path(out) if out else f / "provenance.intoto.json"
    write_atomic(target, dumps(statement))
    return f"provenance: {target}"


__all__ = ["FORMATS", "EXIT_OK", "attest_after_verify", "check_out_path", "is_file_image", "provenance",
           "run_check", "sign"]
