"""What `envbuilder verify --attest`, `envbuilder attest sign|check|provenance` do; cli.py parses
the arguments and calls these with plain values."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..errors import EXIT_OK, EnvbuilderError
from ..output import write_atomic
from . import bounded, check, cosign, sifsign
from .keys import check_key
from .statement import PROVENANCE_PREDICATE, dumps, provenance_statement, verify_statement, why_not_passing
from .subject import file_sha256, file_subject, image_id, is_file_image, subject_for

FORMATS = ("auto", "cosign", "apptainer", "registry")


def _manifest(path: Path | None) -> dict:
    if path is None or not path.is_file():
        raise EnvbuilderError("--attest", "verify ran without a manifest.json, so the stack is unknown",
                              "verify the output folder of envbuilder build (FOLDER or --manifest)")
    text = bounded.read_text(path, "manifest.json")
    data = json.loads(text)
    if not isinstance(data, dict):
        raise EnvbuilderError("manifest.json", f"{path} is not a JSON object", "give the manifest build wrote")
    return data


def check_out_path(out: str) -> None:
    p = Path(out)
    if p.is_dir() or out.endswith("/"):
        raise EnvbuilderError("--attest", f"{out} is a folder; --attest writes one file",
                              "give a file path, e.g. --attest x.sif.att.json")


def attest_after_verify(report: dict, image: str | None, manifest_path: Path | None, out: str, *,
                        site: str | None = None, nodes: int = 1, manifest: dict | None = None) -> str:
    """The statement of a passing verify, written to OUT; a failed or partial verify writes
    nothing and says why (the verify's own exit code stays 1). MANIFEST: the one verify compared
    with (a SIF's own, when no folder was given); else read from MANIFEST_PATH."""
    problem = why_not_passing(report)
    if problem:
        return f"no attestation written: {problem}"
    if not image:
        return "no attestation written: verify ran on the host, not an image"
    if not manifest:
        manifest = _manifest(manifest_path)
    statement = verify_statement(report, manifest, subject_for(image), site=site, nodes=nodes)
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
    fmt = _form(image, fmt, statement_path)
    keyp = check_key(key, private=True)
    text, statement = bounded.load(statement_path, "STATEMENT")
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
    if fmt in ("cosign", "apptainer"):
        if not Path(image).is_file():
            raise EnvbuilderError("--image", f"{image} is not a file", "give the .sif verify ran")
        actual = file_sha256(image)
        if actual != subject:
            raise EnvbuilderError("--image", f"digest differs: {image} is sha256:{actual}, {statement_path} "
                                  f"is of sha256:{subject}", "sign the attestation of this image")
    if fmt == "cosign":
        bundle = Path(f"{statement_path}.bundle")
        with tempfile.TemporaryDirectory(prefix="envbuilder-sign-") as tmp:  # cosign writes where we own
            cosign.sign_blob(Path(statement_path), keyp, Path(tmp) / "bundle")
            write_atomic(bundle, (Path(tmp) / "bundle").read_bytes(), option="attest sign")
        if is_provenance:
            return (f"signed: {bundle} (cosign bundle of the build provenance; check: cosign verify-blob --key PUB "
                    f"--bundle {bundle} --insecure-ignore-tlog=true {statement_path})")
        return f"signed: {bundle} (cosign bundle of {statement_path}; check: envbuilder attest check --image {image} --key PUB)"
    if fmt == "apptainer":
        sifsign.add_and_sign(Path(image), Path(statement_path), keyp)
        return f"signed: {image} (attestation in its signed group; check: apptainer verify --key PUB {image})"
    # registry: cosign attest puts the predicate on the manifest digest; `verified` keeps the
    # image verify ran (its ID, which the pushed manifest's config digest is)
    if "@sha256:" not in image:
        raise EnvbuilderError("--image", f"{image} names no digest", "give REPO@sha256:DIGEST (build --push prints it)")
    try:
        local = image_id(image)
    except EnvbuilderError:
        local = None
    if local is not None and local != subject:
        raise EnvbuilderError("--image", f"digest differs: {image} is image sha256:{local}, {statement_path} "
                              f"is of sha256:{subject}", "sign the attestation of this image")
    predicate = dict(statement["predicate"])
    predicate["verified"] = statement["subject"][0]
    with tempfile.TemporaryDirectory(prefix="envbuilder-attest-") as tmp:
        pred = Path(tmp) / "predicate.json"
        pred.write_text(json.dumps(predicate, indent=1))
        cosign.attest(image, pred, statement["predicateType"], keyp)
    return f"attested: {image} (cosign attestation in the registry)"


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
    files = {name: file_sha256(f / name) for name in ("Dockerfile", "Apptainer.def", "envbuilder.lock")
             if (f / name).is_file()}
    record_path = f / "image.json"
    if image is None:
        image = json.loads(bounded.read_text(record_path, "image.json")) if record_path.is_file() else {}
        if not isinstance(image, dict):
            image = {}
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
