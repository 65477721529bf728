"""Key files are the user's or the site's: envbuilder never generates one and never copies one
into an image or an output folder. A file handed in as a key is checked to be a PEM key of the
kind wanted (bounded read) before a tool sees it, so "not a key" is one message, not a tool's
stack of errors."""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

from ..errors import EnvbuilderError

MAX_KEY_BYTES = 64 * 1024
PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)\r?\n-----END \1-----", re.S)
PUBLIC = ("PUBLIC KEY",)
# cosign's own encrypted keys (generate-key-pair / import-key-pair) and plain PKCS#8 / SEC1 / RSA
PRIVATE = ("ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY", "PRIVATE KEY",
           "EC PRIVATE KEY", "RSA PRIVATE KEY")
FIX_PUBLIC = ("give the PEM public key of the signer (cosign.pub from `cosign generate-key-pair`, or "
              "`openssl pkey -pubout` of an Ed25519/ECDSA/RSA key): docs/attestation.md#keys")
FIX_PRIVATE = ("give your PEM private key (cosign.key from `cosign generate-key-pair`, or a key from "
               "`openssl genpkey -algorithm ed25519` for apptainer sign): docs/attestation.md#keys")


def check_key(path: str | Path, *, private: bool, field: str = "--key") -> Path:
    """PATH if it is a PEM key of the kind wanted; else EnvbuilderError (exit 2) naming FIELD."""
    p = Path(path)
    fix = FIX_PRIVATE if private else FIX_PUBLIC
    kind = "private" if private else "public"
    if not p.is_file():
        raise EnvbuilderError(field, f"{path} is not a file", fix)
    try:
        with open(p, "rb") as fh:
            raw = fh.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        raise EnvbuilderError(field, f"cannot read {path}: {exc.strerror or exc}", fix) from None
    if len(raw) > MAX_KEY_BYTES:
        raise EnvbuilderError(field, f"{path} is not a key: more than {MAX_KEY_BYTES // 1024} KiB", fix)
    text = raw.decode("ascii", errors="replace")
    m = PEM.search(text)
    if not m:
        raise EnvbuilderError(field, f"{path} is not a key: no PEM block (-----BEGIN ... KEY-----)", fix)
    label = m.group(1)
    wanted = PRIVATE if private else PUBLIC
    if label not in wanted:
        other = "a private key" if label in PRIVATE else "a public key" if label in PUBLIC else f"a {label}"
        raise EnvbuilderError(field, f"{path} is {other}, not a {kind} key", fix)
    try:
        body = base64.b64decode("".join(m.group(2).split()), validate=True)
    except (binascii.Error, ValueError):
        raise EnvbuilderError(field, f"{path} is not a key: its PEM body is not base64", fix) from None
    if not label.startswith("ENCRYPTED") and (len(body) < 32 or body[0] != 0x30):
        raise EnvbuilderError(field, f"{path} is not a key: its PEM body is no DER key", fix)
    return p
