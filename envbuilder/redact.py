"""Credentials never repeated: user:password@ in a URL is hidden in every message and file.

The lowest layer (imports nothing of envbuilder's), so that errors.py and quoting.py can both use it.
"""

from __future__ import annotations

import re

_URL_CRED_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,15}://)[^/@\s]*@")


def redact_url(text: str) -> str:
    """'https://user:pw@host/x' -> 'https://***@host/x' (in any text: messages, files)."""
    return _URL_CRED_RE.sub(r"\1***@", str(text))


def has_url_credentials(text: str) -> bool:
    return bool(_URL_CRED_RE.search(str(text)))
