"""The whole check of an image against its attestation, in the order a refusal is cheapest:
the key files are keys; the attestation is there and small; its signature verifies with a trusted
key; it is an envbuilder verify statement; its subject is the bytes given (a file hashed once);
verify passed; it is of this stack. The first that fails is the one message (exit 2), its reason
starting with what failed: no attestation, wrong key, digest differs, verify failed, other stack.

Three forms, one set of predicate checks (`check_statement`):
- a file (SIF) with the statement and its cosign bundle beside it (`check_file`)
- a SIF holding the statement in its signed group (`check_signed_sif`: apptainer verify)
- a registry digest with the statement attached by cosign attest (`check_registry`)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import EnvbuilderError
from . import bounded, cosign, sifsign
from .keys import check_key
from .statement import PASSED, VERIFY_PREDICATE
from .subject import fingerprint, image_id, registry_config_digest, stable_file_sha256

FIX_SIGN = "sign a passing verify's attestation with a trusted key: envbuilder attest sign (docs/attestation.md)"


@dataclass(frozen=True)
class Passed:
    form: str
    subject: str           # sha256:HEX the statement is about
    key: str               # the trusted key that verified it
    stack: str
    statement: dict

    def line(self, image: str) -> str:
        s = self.statement["predicate"].get("summary") or {}
        return (f"attestation ok: {image} ({self.subject[:19]}...) passed verify "
                f"({s.get('pass', '?')} passed, {s.get('skip', 0)} skipped; "
                f"{self.statement['predicate'].get('time')}), stack {self.stack[:17]}..., signed by {self.key} "
                f"[{self.form}]")


def refuse(reason: str, fix: str = FIX_SIGN) -> EnvbuilderError:
    return EnvbuilderError("attestation", reason, fix)


def trusted_keys(keys: list[str]) -> list[Path]:
    if not keys:
        raise EnvbuilderError("--key", "no trusted public key given",
                              "give --key PUB.pem (the site's trusted keys: cluster.attestation_keys)")
    return [check_key(k, private=False) for k in keys]


def check_statement(statement: dict, digest: str | None, stack: str | None, where: str) -> str:
    """The predicate's checks; DIGEST the hex the subject must name (None: the signature already
    binds it, as inside a signed SIF). Returns the subject digest."""
    if statement["predicateType"] != VERIFY_PREDICATE:
        raise refuse(f"verify failed: {where} is a {statement['predicateType']} statement, not a verify attestation")
    digests = [s["digest"]["sha256"] for s in statement["subject"]]
    if digest is not None and digest not in digests:
        raise refuse(f"digest differs: the image is sha256:{digest}, the attestation {where} is of "
                     f"sha256:{digests[0]} (another image, or the image changed since)",
                     "verify and attest this image, or run the image the attestation names")
    pred = statement["predicate"]
    if pred.get("result") != PASSED:
        raise refuse(f"verify failed: the attestation {where} records result {pred.get('result')!r}, not {PASSED!r}",
                     "run envbuilder verify until it passes, then attest that run")
    if any(not isinstance(c, dict) or c.get("status") not in ("pass", "skip") for c in pred["checks"]):
        raise refuse(f"verify failed: the attestation {where} lists a check that did not pass",
                     "run envbuilder verify until it passes, then attest that run")
    got = pred["stack"]["id"]
    also = pred["stack"].get("spec_id")     # the spec's image part, for a job rendered without the lock
    if stack is not None and got != stack and not (stack.startswith("spec:") and also == stack):
        hint = (" (this job folder was rendered without the image's lock: render it with the lock, "
                "envbuilder build SPEC --no-build --lock FOLDER/envbuilder.lock)"
                if stack.startswith("spec:") and got.startswith("lock:") else "")
        raise refuse(f"other stack: the attestation {where} is of stack {got}, this job's is {stack}{hint}",
                     "attest an image built from this stack's lock, or rebuild the job folder from the image's spec")
    return digest if digest is not None else digests[0]


def _verify_with(keys: list[Path], verify_one) -> tuple[Path | None, str]:
    reason = ""
    for key in keys:
        problem = verify_one(key)
        if problem is None:
            return key, ""
        reason = problem
    return None, reason


def check_file(image: str, keys: list[str], attestation: str | None = None, bundle: str | None = None,
               stack: str | None = None) -> Passed:
    """Read once, check those bytes, use those bytes: the statement and the bundle are each read
    once into memory; cosign verifies private copies of exactly those bytes (a folder only this
    process can write); exactly those bytes are parsed. The image is hashed through one open
    descriptor, its fingerprint (size, times, inode) taken before and after: a file changed
    while it was hashed is refused."""
    pubs = trusted_keys(keys)
    img = Path(image)
    if not img.is_file():
        raise EnvbuilderError("--image", f"{image} is not a file", "give the .sif the job runs")
    att = Path(attestation) if attestation else Path(f"{image}.att.json")
    text = bounded.read_text(att)
    bnd = Path(bundle) if bundle else Path(f"{att}.bundle")
    bundle_text = bounded.read_bytes_once(bnd, "--bundle", missing=f"no attestation: {att} has no signature "
                                          f"bundle {bnd}", fix=FIX_SIGN)
    with bounded.private_dir() as tmp:
        att_copy = bounded.private_copy(tmp, "statement.json", text)
        bnd_copy = bounded.private_copy(tmp, "statement.json.bundle", bundle_text)
        key, reason = _verify_with(pubs, lambda k: cosign.verify_blob(att_copy, bnd_copy, k))
    if key is None:
        raise refuse(f"wrong key: the signature on {att} does not verify with "
                     f"{', '.join(map(str, pubs))} (signed by another key, or changed after signing: {reason})")
    statement = bounded.parse(text, "--attestation", str(att))
    digest = check_statement(statement, stable_file_sha256(img), stack, str(att))
    return Passed("cosign bundle", f"sha256:{digest}", str(key), statement["predicate"]["stack"]["id"], statement)


def check_signed_sif(image: str, keys: list[str], stack: str | None = None) -> Passed:
    """The SIF is opened once; every apptainer command reads that open file
    (/proc/self/fd/N: the same inode, whatever the path names later) and its fingerprint is the
    same before the first and after the last, so the object parsed is the one apptainer verified."""
    pubs = trusted_keys(keys)
    sif = Path(image)
    if not sif.is_file():
        raise EnvbuilderError("--image", f"{image} is not a file", "give the signed .sif")
    with sifsign.opened(sif) as (fd_path, before):
        text = sifsign.read_attestation(fd_path, shown=sif)
        if text is None:
            raise refuse(f"no attestation: {image} holds no {sifsign.OBJECT_NAME} object",
                         "envbuilder attest sign --format apptainer (docs/attestation.md)")
        key, reason = _verify_with(pubs, lambda k: sifsign.verify(fd_path, k))
        if fingerprint(fd_path) != before:
            raise refuse(f"digest differs: {image} changed while it was checked",
                         "check the SIF again once nothing writes it")
    if key is None and "signature not found" in reason:
        raise refuse(f"no attestation: {image} holds an attestation object but no signature of it ({reason.split('integrity: ')[-1]})",
                     "envbuilder attest sign --format apptainer on a fresh copy of the SIF")
    if key is None and "integrity compromised" in reason:
        raise refuse(f"digest differs: {image} changed after it was signed ({reason.split('integrity: ')[-1]})",
                     "run the SIF as it was signed, or verify, attest and sign this one")
    if key is None and ("object not signed" in reason or "not associated with object group" in reason
                        or "not signed" in reason.lower()):
        raise refuse(f"no attestation: apptainer verify of {image}: {reason.split('integrity: ')[-1]} (the "
                     "attestation object is not covered by a signature)",
                     "envbuilder attest sign --format apptainer on a fresh copy of the SIF")
    if key is None:
        raise refuse(f"wrong key: apptainer verify of {image} fails with {', '.join(map(str, pubs))} "
                     f"(signed by another key, or the SIF changed after signing: {reason})")
    statement = bounded.parse(text, "--attestation", f"{image}:{sifsign.OBJECT_NAME}")
    # the signature covers the file system and the attestation together: no subject hash needed
    digest = check_statement(statement, None, stack, f"in {image}")
    return Passed("apptainer signed group", f"sha256:{digest}", str(key), statement["predicate"]["stack"]["id"],
                  statement)


def pulled_sif_matches(sif: str, ref: str) -> None:
    """SIF was pulled from REF by its digest: `apptainer pull ... docker://REPO@sha256:D` records
    what it pulled as the `From:` of the definition object it writes into the SIF (Def.FILE; its
    label org.label-schema.usage.singularity.deffile.from says the same). Pulled by tag, or from
    another digest, it is refused: a tag can move, so it proves nothing about the bytes."""
    from ..sif import layout

    try:
        _, descriptors = layout.read(Path(sif))
        deffile = next((d for d in descriptors if d.kind == "Def.FILE"), None)
        text = layout.read_object(Path(sif), deffile, 64 * 1024).decode("utf-8", "replace") if deffile else ""
    except (OSError, layout.NotSif) as exc:
        raise EnvbuilderError("--pulled", f"{sif} is not a readable SIF ({exc})",
                              "give the .sif `apptainer pull` wrote, or a local image") from None
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("bootstrap", "from"):
            fields[key.strip().lower()] = value.strip()
    source = fields.get("from", "")
    if fields.get("bootstrap", "").lower() not in ("docker", "oras") or not source:
        raise refuse(f"{sif} records no registry it was pulled from (its definition has "
                     f"{'no From:' if not source else 'Bootstrap: ' + fields.get('bootstrap', '?')})",
                     f"pull it by digest: apptainer pull docker://{ref}")
    want = ref.removeprefix("docker://")
    if "@sha256:" not in source:
        raise refuse(f"{sif} was pulled by tag ({source}), not by digest: a tag can move",
                     f"pull it by digest: apptainer pull docker://{want}")
    if source.rsplit("@sha256:", 1)[1] != want.rsplit("@sha256:", 1)[1] or \
            source.rsplit("@", 1)[0] != want.rsplit("@", 1)[0]:
        raise refuse(f"digest differs: {sif} was pulled from {source}, the attestation is of {want}",
                     f"pull it by digest: apptainer pull docker://{want}")


def check_registry(ref: str, keys: list[str], stack: str | None = None, pulled: str | None = None) -> Passed:
    """REF: REPO@sha256:DIGEST. PULLED: the local image pulled from it, whose ID must be the image
    verify ran (the predicate's `verified`), or a .sif `apptainer pull` made from REF by digest."""
    pubs = trusted_keys(keys)
    if "@sha256:" not in ref:
        raise EnvbuilderError("--image", f"{ref} names no digest",
                              "give the image by digest: REPO@sha256:DIGEST (a tag can move)")
    digest = ref.rsplit("@sha256:", 1)[1]
    texts: list[str] | None = None
    reason = ""
    key = None
    for k in pubs:
        texts, reason = cosign.verify_attestation(ref, k, VERIFY_PREDICATE)
        if texts:
            key = k
            break
    if key is None or not texts:
        raise refuse(registry_reason(ref, pubs, reason))
    last: EnvbuilderError | None = None
    for text in texts:
        statement = bounded.parse(text, "--attestation", ref)
        try:
            check_statement(statement, digest, stack, f"of {ref}")
        except EnvbuilderError as exc:
            last = exc
            continue
        verified = statement["predicate"].get("verified")
        if not isinstance(verified, dict):
            last = refuse(f"digest differs: the attestation of {ref} names no image verify ran (no predicate.verified)",
                          "attest it with envbuilder attest sign --image REPO@sha256:D")
            continue
        ran = verified["digest"]["sha256"]
        # the registry's digest must be the image verify ran: its manifest's config digest (the
        # image ID) is the one the predicate records, else a passing statement was signed onto
        # another image (a bare base, say)
        config = registry_config_digest(ref)
        if config != ran:
            raise refuse(f"digest differs: {ref} is image sha256:{config}, verify ran sha256:{ran} "
                         "(the attestation was signed onto another image)",
                         "run the image verify ran, or verify and attest this one")
        if pulled is not None and Path(pulled).is_file():
            pulled_sif_matches(pulled, ref)
        elif pulled is not None:
            local = image_id(pulled)
            if local != ran:
                raise refuse(f"digest differs: the pulled image {pulled} is sha256:{local}, verify ran sha256:{ran}",
                             "pull the image by the attested digest")
        return Passed("cosign registry attestation", f"sha256:{digest}", str(key),
                      statement["predicate"]["stack"]["id"], statement)
    assert last is not None
    raise last


def registry_reason(ref: str, pubs: list[Path], reason: str) -> str:
    """cosign's reason, as what failed: a signature that no key verifies is `wrong key` (cosign
    then also says `no matching attestations`, so the key's failure is looked for first); no
    attestation at all is `no attestation`."""
    low = reason.lower()
    keys = ", ".join(map(str, pubs))
    if any(w in low for w in ("invalid signature", "signature mismatch", "verification error", "failed to verify",
                              "no matching signatures", "crypto/", "verifying signature")):
        return f"wrong key: no attestation of {ref} verifies with {keys} ({reason})"
    if "no matching attestations" in low or "no signatures found" in low or "not found" in low:
        return f"no attestation: the registry holds no attestation of {ref} ({reason})"
    return f"wrong key: no attestation of {ref} verifies with {keys} ({reason})"
