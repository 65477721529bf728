"""cosign (Sigstore), run as the user's own tool, offline: no transparency log, no signing
config from the network (`--use-signing-config=false --tlog-upload=false` to sign,
`--insecure-ignore-tlog=true` to verify; flags of cosign 3.1, checked by hand here:
/work/shared/ENVIRONMENT.md). An encrypted cosign key's password comes from COSIGN_PASSWORD, as
cosign reads it; nothing here prompts (stdin is closed).

- a file (a SIF): the statement is signed as a blob; the bundle lies beside it (STATEMENT.bundle)
- a registry image: `cosign attest` attaches the predicate, as an in-toto statement whose subject
  is the registry's manifest digest, to that digest in the registry"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import EXIT_CHECK_FAILED, EnvbuilderError

OFFLINE_SIGN = ("--use-signing-config=false", "--tlog-upload=false")
OFFLINE_VERIFY = ("--insecure-ignore-tlog=true",)
MAX_OUTPUT = 4 << 20


def cosign() -> str:
    exe = os.environ.get("ENVBUILDER_COSIGN") or shutil.which("cosign")
    if not exe:
        raise EnvbuilderError("cosign", "no cosign command on this machine",
                              "install cosign (bash .ci/install-cosign.sh: Debian's package, 3.1.1) or put it on PATH")
    return exe


def _run(argv: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([cosign(), *argv], capture_output=True, text=True, errors="replace", timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EnvbuilderError("cosign", f"cosign {argv[0]} took more than {timeout} s", "") from None


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [l.strip() for l in (proc.stderr or "").splitlines()
             if l.strip() and not l.startswith(("WARNING", "Flag --"))]
    for l in lines:
        if l.startswith("Error:"):
            return l.removeprefix("Error:").strip()[:300]
    return (lines[-1] if lines else f"exit {proc.returncode}")[:300]


def sign_blob(statement: Path, key: Path, bundle: Path) -> None:
    proc = _run(["sign-blob", "--key", str(key), *OFFLINE_SIGN, "--yes", "--bundle", str(bundle), str(statement)])
    if proc.returncode != 0:
        raise EnvbuilderError("cosign sign-blob", _error_line(proc),
                              "check the key and its password (COSIGN_PASSWORD)", exit_code=EXIT_CHECK_FAILED)


def verify_blob(statement: Path, bundle: Path, pub: Path) -> str | None:
    """None when BUNDLE's signature over STATEMENT verifies with PUB; else cosign's reason."""
    proc = _run(["verify-blob", "--key", str(pub), "--bundle", str(bundle), *OFFLINE_VERIFY, str(statement)])
    return None if proc.returncode == 0 else _error_line(proc)


def registry_flags(ref: str) -> list[str]:
    host = ref.split("/", 1)[0]
    return ["--allow-insecure-registry"] if host.startswith(("127.0.0.1", "localhost", "[::1]")) else []


def attest(ref: str, predicate: Path, predicate_type: str, key: Path) -> None:
    proc = _run(["attest", "--key", str(key), "--type", predicate_type, "--predicate", str(predicate),
                 *OFFLINE_SIGN, "--yes", *registry_flags(ref), ref])
    if proc.returncode != 0:
        raise EnvbuilderError("cosign attest", _error_line(proc),
                              "check the key, its password (COSIGN_PASSWORD) and that REF is REPO@sha256:DIGEST "
                              "in a registry you can push to", exit_code=EXIT_CHECK_FAILED)


def verify_attestation(ref: str, pub: Path, predicate_type: str) -> tuple[list[str] | None, str]:
    """(the statements' texts, "") when the registry holds attestations of REF signed by PUB; else
    (None, cosign's reason)."""
    proc = _run(["verify-attestation", "--key", str(pub), "--type", predicate_type, *OFFLINE_VERIFY,
                 *registry_flags(ref), ref])
    if proc.returncode != 0:
        return None, _error_line(proc)
    if len(proc.stdout) > MAX_OUTPUT:
        return None, f"cosign printed more than {MAX_OUTPUT} bytes of attestations"
    texts = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            envelope = json.loads(line)
            texts.append(base64.b64decode(envelope["payload"], validate=True).decode("utf-8"))
        except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError):
            return None, "cosign printed an envelope that is not DSSE JSON"
    return texts, ""
