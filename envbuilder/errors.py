"""Errors a user sees: each names the field or step, the reason and the fix."""

from __future__ import annotations

import re

from .redact import redact_url      # credentials in a URL are never repeated

# C0, DEL, C1 and the two Unicode line separators: every character some reader of a generated file
# takes as the end of a line (Python's str.splitlines, which pip's requirements parser uses, splits at
# \x0b \x0c \x1c-\x1e \x85 \u2028 \u2029 too; YAML at \x85 \u2028 \u2029) or that a terminal obeys
# (an escape sequence in a file name can rewrite the screen). quoting.py refuses them in a generated
# file; a message shows them escaped.
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def escape_controls(text: str, keep_lines: bool = False) -> str:
    """Each character of CONTROL_RE in TEXT as \\xNN / \\uNNNN; KEEP_LINES: but for newline and tab
    (a message's own line breaks)."""
    return (_CONTROL_BUT_LINES if keep_lines else CONTROL_RE).sub(
        lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100 else f"\\u{ord(m.group(0)):04x}", text)

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


class EnvbuilderError(Exception):
    """A problem the user can act on.

    ``field`` is a dotted path into the spec (``cuda.version``) or the name of a step
    (``docker build``); ``line`` the spec line when known; ``fix`` what to do about it.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, field: str, reason: str, fix: str = "", *, line: int | None = None,
                 source: str | None = None, exit_code: int | None = None):
        super().__init__(reason)
        self.field = field
        self.reason = reason
        self.fix = fix
        self.line = line
        self.source = source
        if exit_code is not None:
            self.exit_code = exit_code

    def where(self) -> str:
        place = self.source or ""
        if self.line is not None:
            place = f"{place}:{self.line}" if place else f"line {self.line}"
        return place

    def message(self) -> str:
        """What `error:` prints: the place and field with every control character escaped (they are
        names: a file's, a key's), the reason and fix with all but their own newlines and tabs
        escaped (a file name in them cannot move the cursor, clear the screen or retitle the
        terminal)."""
        where = escape_controls(self.where())
        head = f"{where}: " if where else ""
        text = f"{head}{escape_controls(str(self.field))}: {escape_controls(str(self.reason), keep_lines=True)}"
        if self.fix:
            text += f"\n  fix: {escape_controls(str(self.fix), keep_lines=True)}"
        return redact_url(text)

    def as_dict(self) -> dict:
        return {"field": redact_url(self.field), "reason": redact_url(self.reason), "fix": redact_url(self.fix),
                "line": self.line, "source": self.source}

    def __str__(self) -> str:
        return self.message()


class SpecErrors(EnvbuilderError):
    """Several problems found in one pass over a spec; reported together."""

    def __init__(self, errors: list[EnvbuilderError]):
        self.errors = errors
        first = errors[0]
        super().__init__(first.field, first.reason, first.fix, line=first.line, source=first.source)

    def message(self) -> str:
        return "\n".join(e.message() for e in self.errors)

    def as_dict(self) -> dict:
        return {"errors": [e.as_dict() for e in self.errors]}


class CheckFailed(EnvbuilderError):
    """A step ran and failed (a build, a verification): exit code 1."""

    exit_code = EXIT_CHECK_FAILED
