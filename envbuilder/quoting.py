"""The one place where a value becomes text in a generated file, per target language.

Every renderer writes spec, site and lock values through these functions; none escapes by
hand. Each function either returns text that the target reads back as exactly ``value`` (a
literal), or refuses (``UnsafeValue``) what it cannot carry: a newline or other control
character can never be made safe in a line-oriented file, so it never reaches one.

    shell_word(v)          POSIX shell: one word, literal ('...' quoting, shlex rules)
    shell_dq(v)            POSIX shell, inside "...": literal, but for $NAME / ${NAME},
                           which expand (paths like $SCRATCH/x in cluster.* defaults)
    docker_value(v)        Dockerfile ENV/LABEL value: "..." with $ escaped (literal) unless
                           ``expand`` (the components' own $PATH templates)
    docker_comment(v)      text after "# " on one line
    comment_text(v)        any text (a path the user named) after "# " on one line: escaped,
                           never refused (requirements and conda lists that `export` writes)
    one_line(v)            a component's shell command line inside a RUN step
    apptainer_export(k, v) one %environment line: export K='literal'
    apptainer_line(v)      one line of %labels / %help / %runscript / header text
    sbatch_value(v)        a #SBATCH option value as sbatch's parser reads it
    metadata_dq(v)         POSIX shell, inside "...": every character literal, newlines
                           included (an image's own ENV values in the SIF's scripts)
    metadata_words(vs)     POSIX shell words, every character literal, newlines included
                           (an image's ENTRYPOINT/CMD in the SIF's runscript)
    (credentials in URLs are hidden by redact.py, the layer below this one)
"""

from __future__ import annotations

import re
import shlex

from .errors import CONTROL_RE, EnvbuilderError, escape_controls
from .redact import redact_url

VARIABLE_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# $NAME, ${NAME}, ${NAME:-} and ${NAME:+:$NAME} (a colon and the old value only when set): expansions
# that run nothing
_VAR_RE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*(?::-)?\}"
                     r"|\{(?P<n>[A-Za-z_][A-Za-z0-9_]*):\+:\$(?P=n)\})")
# what sbatch's option parser takes unquoted in a #SBATCH line (no space, quote, #, \)
_SBATCH_RE = re.compile(r"[A-Za-z0-9._,:%=+/@-]+")
# an image reference: [registry[:port]/]path[:tag][@sha256:digest] (distribution/reference's
# grammar, https://github.com/distribution/reference/blob/main/regexp.go, written so that no
# two branches overlap: linear time)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF_RE = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?/)?"
    + _COMPONENT + r"(?:/" + _COMPONENT + r")*"
    + r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?")


class UnsafeValue(EnvbuilderError):
    """A value the target language cannot carry (a renderer got something validation should
    have refused): exit 2, naming what it is."""


def _plain(value: str, what: str) -> str:
    value = str(value)
    if CONTROL_RE.search(value):
        raise UnsafeValue(what, f"{redact_url(value)!r} holds a newline or another control character",
                          "write it on one line, without control characters")
    return value





# --- POSIX shell -------------------------------------------------------------------------------

def shell_word(value: str, what: str = "value") -> str:
    """One literal shell word: nothing in it expands or ends the command."""
    return shlex.quote(_plain(value, what))


def shell_words(values, what: str = "value") -> str:
    """A command line of literal words."""
    return " ".join(shell_word(v, what) for v in values)


def shell_dq(value: str, what: str = "value") -> str:
    """The inside of a double-quoted shell string (the caller writes the quotes): every
    character literal but for $NAME / ${NAME} references, which expand. `$(...)`, backticks,
    `${X:-$(...)}` and quotes stay text."""
    return _dq(value, what, r'([\\"`$])')


def shell_default(value: str, what: str = "value") -> str:
    """The default word of "${NAME:-...}" (inside double quotes): as shell_dq, and a } does
    not end the expansion early."""
    return _dq(value, what, r'([\\"`$}])')


def _dq(value: str, what: str, special: str) -> str:
    value = _plain(value, what)
    out, pos = [], 0
    for m in _VAR_RE.finditer(value):
        out.append(re.sub(special, r"\\\1", value[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(re.sub(special, r"\\\1", value[pos:]))
    return "".join(out)


def metadata_dq(value: str) -> str:
    """The inside of "..." holding an image's own metadata literally. Unlike shell_dq nothing
    expands and a newline is carried (inside double quotes it is text): the image's ENV and
    ENTRYPOINT are the image author's, copied as Apptainer's own conversion copies them."""
    return re.sub(r'([\\"`$])', r"\\\1", str(value))


def metadata_words(values) -> str:
    """Shell words that are an image's ENTRYPOINT/CMD, each literal (newlines carried)."""
    return " ".join(shlex.quote(str(v)) for v in values)


def oci_runscript(entrypoint, cmd) -> list[str]:
    """The lines of a runscript that runs an image's ENTRYPOINT and CMD as `docker run IMAGE [ARGS]`
    does: arguments replace CMD (OCI semantics; each word literal, nothing evaluated). They are both
    the definition file's %runscript and the runscript of envbuilder's own .sif, so `apptainer run`
    does the same with either .sif (and `apptainer inspect --runscript` shows the same text) and
    what `docker run` does with the Dockerfile's image."""
    entry, command = metadata_words(entrypoint), metadata_words(cmd)
    lines = ["# the image's ENTRYPOINT and CMD; arguments replace CMD (as docker run IMAGE ARGS)"]
    if command:
        lines.append(f'if [ "$#" -eq 0 ]; then set -- {command}; fi')
    elif not entry:
        lines.append('if [ "$#" -eq 0 ]; then set -- /bin/sh; fi')
    lines.append(f'exec {entry} "$@"' if entry else 'exec "$@"')
    return lines


def shell_assign(name: str, value: str, what: str = "value") -> str:
    """NAME='value' (the name checked as a shell variable name)."""
    if not VARIABLE_NAME_RE.fullmatch(name):
        raise UnsafeValue(what, f"{name!r} is not a variable name", "use letters, digits and _")
    return f"{name}={shell_word(value, what)}"


# --- Dockerfile --------------------------------------------------------------------------------

def docker_value(value: str, what: str = "value", *, expand: bool = False) -> str:
    """A double-quoted ENV/LABEL value. Docker substitutes $VAR in ENV and LABEL: a literal
    value gets every $ escaped, so the image holds the text as written. ``expand`` keeps
    $NAME/${NAME...} live (the components' own templates such as /opt/venv/bin:$PATH)."""
    value = _plain(value, what)
    value = value.replace("\\", "\\\\").replace('"', '\\"')
    if not expand:
        value = value.replace("$", "\\$")
    return f'"{value}"'


def docker_comment(value: str, what: str = "comment") -> str:
    """Text after `# ` on one comment line."""
    return _plain(value, what)


def comment_text(value: str) -> str:
    """Text after `# ` that stays on its line in any reader (pip, conda, YAML, a shell, a
    terminal): a backslash becomes \\\\, each character of CONTROL_RE \\xNN or \\uNNNN. For text
    that is the user's by nature (a folder name: a file system allows a newline in it), where
    refusing would only refuse the user's own path."""
    return escape_controls(str(value).replace("\\", "\\\\"))


__all__ = ["CONTROL_RE", "escape_controls"]      # they live in errors.py (below this module), re-exported


def one_line(value: str, what: str = "value") -> str:
    """A line of a RUN step the components wrote (already shell): it must stay one line."""
    return _plain(value, what)


def image_ref(value: str, what: str = "base") -> str:
    """An image reference in FROM / From: lines: checked, never quoted (no syntax for it)."""
    value = _plain(value, what)
    if len(value) > 512 or not IMAGE_REF_RE.fullmatch(value):
        raise UnsafeValue(what, f"{value!r} is not an image reference",
                          "write registry/name:tag or name@sha256:DIGEST")
    return value


# --- Apptainer definition file -----------------------------------------------------------------

def apptainer_export(name: str, value: str, what: str = "env", *, expand: bool = False) -> str:
    """One %environment line (the section is sourced by /bin/sh at every container start):
    literal values single-quoted, so the image holds what Docker's ENV holds."""
    if not VARIABLE_NAME_RE.fullmatch(name):
        raise UnsafeValue(what, f"{name!r} is not a variable name", "use letters, digits and _")
    if expand:
        return f'export {name}="{shell_dq(value, what)}"'
    return f"export {name}={shell_word(value, what)}"


def apptainer_text(value: str, what: str = "value") -> str:
    """Text after the first word of a line (a %labels value): one line."""
    return _plain(value, what)


def apptainer_line(value: str, what: str = "value") -> str:
    """Text on one line of a section: a line whose first word starts with % would open a new
    section (%setup runs on the build host as root), so such a line is refused too."""
    value = _plain(value, what)
    if value.lstrip().startswith("%"):
        raise UnsafeValue(what, f"{value!r} starts with %, which opens a section in Apptainer.def",
                          "do not start the value with %")
    return value


# --- Slurm #SBATCH directives ------------------------------------------------------------------

def sbatch_value(value, what: str = "value") -> str:
    """A value after `#SBATCH --opt=`: sbatch splits the line at blanks and quotes, and stops
    reading directives at the first line that is not one, so only plain tokens are written."""
    value = _plain(str(value), what)
    if not _SBATCH_RE.fullmatch(value):
        raise UnsafeValue(what, f"{value!r} cannot be written in an #SBATCH line",
                          "use letters, digits and . _ , : % = + / @ -")
    return value
