"""Credentials: the one detector, by name and by value, and the one redactor of every message.

A value is a credential when it holds a login in a URL (``scheme://user:password@host``: the whole
userinfo, up to the last @ before the host), a conda channel token (``/t/TOKEN/`` in a URL), a token-like query parameter (``?token=``,
``&sig=``, ``X-Amz-Signature=``...) or a string shaped like a well-known token (``ghp_...``,
``AKIA...``, a JWT...). A name is a credential's when it reads like one (``*TOKEN*``, ``*_PWD``,
``*_KEY``...). Spec, site and sweep values found so are refused (spec/schema.py, slurm/sweeps.py),
never written; every message goes through ``redact`` (errors.py), which hides all of them.

The lowest layer (imports nothing of envbuilder's), so that errors.py and quoting.py can both use it.
"""

from __future__ import annotations

import re

# scheme://USERINFO@host: RFC 3986 3.2 -- the authority ends at the first / ? # (a blank ends the
# URL in text); the userinfo is everything up to its LAST @ (a password may hold a raw @) that a
# host follows (a letter, a digit or an IPv6 literal's [): the text of a message such as
# `NAME @ git+https://...@<commit>` holds no login (issue 48 item 2)
_URL_CRED_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,15}://)[^/?#\s\"'<>]*@(?=[a-z0-9\[])")
# a URL in text (linear: one greedy run, nothing after it to backtrack for)
_URL_RE = re.compile(r"(?i)\b[a-z][a-z0-9+.-]{0,15}://[^\s\"'<>]*")
# conda's channel token, a path segment /t/TOKEN anywhere in the URL (anaconda.org's
# https://conda.anaconda.org/t/TOKEN/CHANNEL; conda's own split_anaconda_token reads it so)
_CONDA_TOKEN_RE = re.compile(r"/t/([^/?#\s\"'<>]+)")

# query (or fragment) parameters whose value is a credential. Sources: OAuth 2.0 bearer tokens in
# a query (RFC 6750 2.3: access_token), AWS SigV4 presigned URLs (X-Amz-Signature, -Credential,
# -Security-Token), Google Cloud Storage signed URLs (X-Goog-Signature, -Credential), Azure
# Storage SAS (sig), and the names private package indexes and model hubs use (token, auth,
# key, api_key, password, secret, client_secret).
QUERY_NAMES = ("access_token", "refresh_token", "id_token", "token", "auth", "auth_token", "api_key",
               "apikey", "key", "password", "passwd", "pwd", "secret", "client_secret", "sig",
               "signature", "x-amz-signature", "x-amz-credential", "x-amz-security-token",
               "x-goog-signature", "x-goog-credential", "private_token")
_QUERY_RE = re.compile(r"(?i)([?&;#](?:" + "|".join(re.escape(n) for n in QUERY_NAMES) + r")=)[^&;#\s\"'<>]+")

# well-known token shapes, each with where its format is published
TOKEN_SHAPES = (
    # GitHub: "Behind GitHub's new authentication token formats" (github.blog, 2021-04-05)
    ("a GitHub token", r"gh[pousr]_[A-Za-z0-9]{30,}"),
    ("a GitHub token", r"github_pat_[A-Za-z0-9_]{30,}"),
    # GitLab: docs.gitlab.com/ee/security/token_overview.html (token prefixes)
    ("a GitLab token", r"gl(?:pat|dt|rt|ptt|oas|cbt)-[A-Za-z0-9_-]{20,}"),
    # Slack: api.slack.com/authentication/token-types (xoxb, xoxp, xoxa, xoxr, xoxs)
    ("a Slack token", r"xox[bpars]-[A-Za-z0-9-]{10,}"),
    # AWS: IAM user guide, "Understanding unique ID prefixes" (AKIA long-term, ASIA temporary keys)
    ("an AWS access key", r"(?:AKIA|ASIA)[A-Z0-9]{16}"),
    # Hugging Face: huggingface.co/docs/hub/security-tokens (hf_ + 34 characters)
    ("a Hugging Face token", r"hf_[A-Za-z0-9]{30,}"),
    # PyPI API tokens: pypi.org/help/#apitoken (a macaroon starting pypi-AgEIcHlwaS5vcmc)
    ("a PyPI token", r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{20,}"),
    # npm: docs.npmjs.com/about-access-tokens (npm_ + 36 characters)
    ("an npm token", r"npm_[A-Za-z0-9]{36}"),
    # Google API keys: cloud.google.com/docs/authentication/api-keys (AIza + 35 characters)
    ("a Google API key", r"AIza[A-Za-z0-9_-]{35}"),
    # JSON Web Tokens: RFC 7519 (base64url of a JSON header and payload, both starting {" = eyJ)
    ("a JSON Web Token", r"eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
    # PEM private keys: RFC 7468 ("-----BEGIN ... PRIVATE KEY-----")
    ("a private key", r"-----BEGIN [A-Z ]{0,20}PRIVATE KEY-----"),
)
# a shape starts where no token character stands before it; for a JWT, not after a "-" either (its
# segments hold "-", so `eyJ-eyJ-...` would start a match at every eyJ, each one running to the end
# of the text and back: quadratic in a long line)
_SHAPE_RES = tuple((what, re.compile((r"(?<![A-Za-z0-9_-])" if pattern.startswith("eyJ") else r"(?<![A-Za-z0-9_])")
                                     + pattern)) for what, pattern in TOKEN_SHAPES)

# variable names that hold credentials: their values would be readable by anyone who has the image
# or the job script. *_PWD but not PWD/OLDPWD (the shell's folders); *_KEY, *_PAT (GitHub's
# personal access tokens), AUTH as a word.
SECRET_NAME_RE = re.compile(
    r"(?i).*(?:TOKEN|PASSWORD|PASSWD|PASSPHRASE|SECRET|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|COOKIE).*"
    r"|.*_(?:PAT|PWD|PASS|KEY)|(?:.*_)?AUTH(?:_.*)?|PAT")


def secret_name(name: str) -> bool:
    """True when NAME reads like a credential's variable (MYSQL_PWD, GITHUB_PAT, HF_TOKEN...)."""
    return bool(SECRET_NAME_RE.fullmatch(str(name)))


def credential_in(text: str) -> str | None:
    """What credential TEXT holds ('a login in a URL (user:password@)', 'a GitHub token'...), or None."""
    text = str(text)
    if _URL_CRED_RE.search(text):
        return "a login in a URL (user:password@)"
    if any(_CONDA_TOKEN_RE.search(m.group(0)) for m in _URL_RE.finditer(text)):
        return "a conda channel token in a URL (/t/TOKEN/)"
    m = _QUERY_RE.search(text)
    if m:
        return f"a credential in a URL's query ({m.group(1)[1:]}...)"
    for what, pattern in _SHAPE_RES:
        if pattern.search(text):
            return what
    return None


def redact(text: str) -> str:
    """Every credential in TEXT hidden: 'https://u:p@w@host/x?token=t' -> 'https://***@host/x?token=***',
    'https://conda.anaconda.org/t/TOKEN/ch' -> 'https://conda.anaconda.org/t/***/ch',
    'ghp_abc...' -> 'ghp_***' (messages and files)."""
    text = _URL_CRED_RE.sub(r"\1***@", str(text))
    text = _URL_RE.sub(lambda m: _CONDA_TOKEN_RE.sub("/t/***", m.group(0)), text)
    text = _QUERY_RE.sub(r"\1***", text)
    for _, pattern in _SHAPE_RES:
        text = pattern.sub(lambda m: m.group(0)[:4] + "***", text)
    return text


def strip_credentials(url: str) -> str:
    """URL without what ``redact`` hides: its login, a conda /t/TOKEN segment, token-like query
    parameters (the URL a spec may keep: 'https://conda.anaconda.org/t/TOKEN/ch' ->
    'https://conda.anaconda.org/ch')."""
    text = _URL_CRED_RE.sub(r"\1", str(url))
    text = _URL_RE.sub(lambda m: _CONDA_TOKEN_RE.sub("", m.group(0)), text)
    text = re.sub(r"(?i)[?&;#](?:" + "|".join(re.escape(n) for n in QUERY_NAMES) + r")=[^&;#\s\"'<>]*", "", text)
    return text


def redact_url(text: str) -> str:
    """The same as ``redact`` (the name the callers have used)."""
    return redact(text)


def has_url_credentials(text: str) -> bool:
    return credential_in(text) is not None
