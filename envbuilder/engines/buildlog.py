"""Reading a failed build's log: which lock entry a hash or version failure is about, and a TLS
certificate the build's pip did not trust."""

from __future__ import annotations

import re


CERTIFICATE_FAILURE = re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|SSLCertVerificationError")


def certificate_failure(log_lines: list[str], ca_bundle: str | None) -> str | None:
    """A build whose pip (or download) did not trust an index's TLS certificate: what to do."""
    if not any(CERTIFICATE_FAILURE.search(line) for line in log_lines):
        return None
    if ca_bundle:
        return (f"the build's pip did not trust the index's TLS certificate, and the CA bundle handed to "
                f"it ({ca_bundle}) does not hold the CA that signed it: give --ca-bundle the bundle that "
                "holds your proxy's or index's CA")
    return ("the build's pip did not trust the index's TLS certificate (a TLS-intercepting proxy, or an "
            "index with a CA of its own): give --ca-bundle FILE with that CA (e.g. "
            "/etc/ssl/certs/ca-certificates.crt where this machine trusts it); it reaches the build as a "
            "secret, never a layer")


def explain_build_failure(log_lines: list[str], lock) -> str | None:
    """A build that failed on a hash or a vanished version names the lock entry."""
    if lock is None:
        return None
    lines = [re.sub(r"^#\d+ [\d.]+ ", "", l).strip() for l in log_lines]
    for n, line in enumerate(lines):
        if "DO NOT MATCH THE HASHES" in line:
            for nxt in lines[n + 1:n + 4]:
                m = re.match(r"^(\S+) from (\S+?)(#\S*)?(:$| \(from )", nxt)
                if m:
                    fname = m.group(2).rsplit("/", 1)[-1].replace("%2B", "+")
                    got = next((re.search(r"Got\s+([0-9a-f]{64})", l) for l in lines[n:n + 8]
                                if re.search(r"Got\s+([0-9a-f]{64})", l)), None)
                    return (f"pip: {m.group(1)}: the download {fname} does not match the sha256 in "
                            "envbuilder.lock" + (f" (it is {got.group(1)[:16]}...)" if got else "")
                            + "; do not edit hashes: re-resolve with envbuilder lock SPEC --update NAME")
    for line in lines:
        m = re.match(r"^(\S+): FAILED$", line)
        if m:
            return f"sources: {m.group(1).rsplit('/', 1)[-1]} does not match its sha256 in envbuilder.lock"
        m = re.search(r"E: Version '([^']+)' for '([^']+)' was not found", line)
        if m:
            return (f"apt: {m.group(2)} {m.group(1)} (envbuilder.lock) is no longer in the archive; "
                    f"re-lock it: envbuilder lock SPEC --update {m.group(2)}")
    return None
