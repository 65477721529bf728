"""Errors a user sees: each names the field or step, the reason and the fix."""

from __future__ import annotations

from .redact import redact_url      # credentials in a URL are never repeated

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
        where = self.where()
        head = f"{where}: " if where else ""
        text = f"{head}{self.field}: {self.reason}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
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
