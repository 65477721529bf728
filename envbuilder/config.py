"""What a site or a user sets once: the configuration files, the ENVBUILDER_* variables and the
command line, in one place (docs/config.md).

Precedence, first wins: the command line, the environment (``ENVBUILDER_<KEY>``), the user's file
(``$XDG_CONFIG_HOME/envbuilder/config.toml``, default ``~/.config/envbuilder/config.toml``), the
site's file (``/etc/envbuilder/config.toml``, or the file ``ENVBUILDER_CONFIG`` names instead),
then the default. Every value keeps where it came from (``Config.origin``), so a message about a
value can say where to change it.

A file is flat TOML (``key = "value"``); a malformed file, an unknown key or a value of the wrong
type is one message naming the file, the line, the key and the fix (exit 2). A relative path in
a file is relative to that file's folder; in a variable or on the command line, to the working
folder. Nothing here checks that a named file exists (``require_path`` does, where it is used), so
``envbuilder config`` and ``envbuilder doctor`` can show a broken set-up.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EnvbuilderError

if sys.version_info >= (3, 11):
    import tomllib
else:                                   # pragma: no cover - Python 3.9/3.10
    import tomli as tomllib

SITE_FILE = Path("/etc/envbuilder/config.toml")
ENV_CONFIG = "ENVBUILDER_CONFIG"
MAX_FILE_BYTES = 1 << 20
DEFAULT_INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class Key:
    kind: str           # dir | file | url | urls | mirror | channels | name | runtime
    help: str
    example: str
    default: str | None = None


# the one table of keys: validation, `envbuilder config`, docs/config.md (tests/test_config.py)
KEYS: dict[str, Key] = {
    "wheelhouse": Key("dir", "folder of local wheels pip uses first, in the lock and the build (offline "
                      "sites; --wheelhouse)", '"/opt/wheels"'),
    "ca_bundle": Key("file", "PEM bundle the lock and the build's pip trust (a TLS-intercepting proxy); "
                     "handed to the build as a secret, never stored in the image (--ca-bundle)",
                     '"/etc/ssl/certs/ca-certificates.crt"'),
    "pip_index_url": Key("url", "the pip index the lock resolves against and the build's pip "
                         "installs from (a site's PyPI mirror)", '"https://pypi.example.org/simple"', DEFAULT_INDEX),
    "extra_index_url": Key("urls", "more pip indexes, after pip_index_url (a string, or a list of URLs)",
                           '["https://pypi.example.org/extra/simple"]'),
    "netrc": Key("file", "netrc file with a private index's login (machine HOST login USER password "
                 "TOKEN); a build secret like ca_bundle (--netrc)", '"~/.netrc"'),
    "registry_mirror": Key("mirror", "a pull-through mirror standing for Docker Hub, as dockerd's "
                           "registry-mirrors: http(s)://host[:port]", '"https://mirror.example.org"'),
    "conda_channel": Key("channels", "conda channels replacing the spec's packages.conda_channels (the "
                         "site's mirror; a string with commas, or a list)",
                         '"https://conda.example.org/conda-forge"'),
    "site": Key("name", "the site profile `build` and `check` use when --site is not given "
                "(a name in sites/ or a file)", '"example-gpu"'),
    "runtime": Key("runtime", "how job.sbatch runs the image when --runtime is not given "
                   "(like --runtime, over the spec's cluster.runtime)", '"apptainer"'),
}


def env_name(key: str) -> str:
    return "ENVBUILDER_" + key.upper()


@dataclass(frozen=True)
class Value:
    value: str
    origin: str


@dataclass(frozen=True)
class ConfigFile:
    kind: str           # "user" or "site"
    path: Path
    read: bool          # False: not there (a default location)
    why: str = ""       # how it was chosen (ENVBUILDER_CONFIG, XDG_CONFIG_HOME, default)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "read": self.read, "chosen_by": self.why}


@dataclass
class Config:
    values: dict[str, Value] = field(default_factory=dict)
    files: list[ConfigFile] = field(default_factory=list)

    def get(self, key: str) -> str | None:
        _known(key)
        v = self.values.get(key)
        return v.value if v else KEYS[key].default

    def origin(self, key: str) -> str:
        _known(key)
        v = self.values.get(key)
        return v.origin if v else "default"

    def items(self) -> list[tuple[str, str | None, str]]:
        """Every known key, in the table's order: (key, value or None, origin)."""
        return [(k, self.get(k), self.origin(k)) for k in KEYS]

    def list(self, key: str) -> list[str]:
        """A list key's values (extra_index_url: spaces; conda_channel: commas)."""
        raw = self.get(key) or ""
        parts = raw.split() if KEYS[key].kind == "urls" else raw.split(",")
        return [p.strip() for p in parts if p.strip()]

    def as_dict(self) -> dict:
        return {"keys": [{"key": k, "value": v, "origin": o, "env": env_name(k), "help": KEYS[k].help}
                         for k, v, o in self.items()],
                "files": [f.as_dict() for f in self.files]}


def _known(key: str) -> None:
    if key not in KEYS:
        raise KeyError(f"not a configuration key: {key}")


# --- loading ------------------------------------------------------------------------------------

def config_files(environ: Mapping[str, str]) -> list[tuple[str, Path, str, bool]]:
    """(kind, path, chosen by, must exist) in the order they are read: site first, user over it."""
    home = environ.get("HOME") or str(Path.home())
    xdg = environ.get("XDG_CONFIG_HOME")
    user = (Path(xdg) if xdg else Path(home) / ".config") / "envbuilder" / "config.toml"
    named = environ.get(ENV_CONFIG, "")
    site = (Path(named), ENV_CONFIG, True) if named else (SITE_FILE, "default", False)
    return [("site", site[0], site[1], site[2]),
            ("user", user, "XDG_CONFIG_HOME" if xdg else "default", False)]


def load_config(cli: dict | None = None, environ: Mapping | None = None) -> Config:
    """The configuration in force: ``cli`` (key -> value, None: not given) over ``environ``
    (default os.environ) over the user's file over the site's. Bad input raises EnvbuilderError."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    cfg = Config()
    layers: list[dict[str, Value]] = []
    for kind, path, why, must in config_files(env):
        if not must and not path.exists():
            cfg.files.append(ConfigFile(kind, path, False, why))
            continue
        layers.append(_read_file(kind, path, why))
        cfg.files.append(ConfigFile(kind, path, True, why))
    from_env: dict[str, Value] = {}
    for key in KEYS:
        raw = env.get(env_name(key))
        if raw is not None and raw.strip():
            where = f"environment {env_name(key)}"
            from_env[key] = Value(_check(key, raw.strip(), where, env_name(key), base=None), where)
    layers.append(from_env)
    from_cli: dict[str, Value] = {}
    for key, raw in (cli or {}).items():
        if key not in KEYS:
            raise KeyError(f"not a configuration key: {key}")
        if raw is None or raw == "":
            continue
        flag = "--" + key.replace("_", "-")
        where = f"command line {flag}"
        value = " ".join(raw) if isinstance(raw, (list, tuple)) else str(raw)
        from_cli[key] = Value(_check(key, value, where, flag, base=None), where)
    layers.append(from_cli)
    for layer in layers:
        cfg.values.update(layer)
    return cfg


def _read_file(kind: str, path: Path, why: str) -> dict[str, Value]:
    label = f"{kind} config"
    fix_named = f" (named by {ENV_CONFIG})" if why == ENV_CONFIG else ""
    try:
        if not path.is_file():
            raise EnvbuilderError(ENV_CONFIG if why == ENV_CONFIG else label, f"{path} is not a file{fix_named}",
                                  f"point {ENV_CONFIG} at a TOML file, or unset it" if why == ENV_CONFIG
                                  else f"make {path} a TOML file, or remove it", source=str(path))
        data = path.read_bytes()[:MAX_FILE_BYTES + 1]
    except OSError as exc:
        raise EnvbuilderError(label, f"cannot read {path}: {exc.strerror or exc}",
                              "make the file readable, or remove it", source=str(path)) from None
    if len(data) > MAX_FILE_BYTES:
        raise EnvbuilderError(label, "larger than 1 MiB: not a configuration file",
                              "keep only the keys of docs/config.md in it", source=str(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EnvbuilderError(label, "not UTF-8 text", "save the file as UTF-8 TOML", source=str(path)) from None
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        line = int(found.group(1)) if found else None
        reason = re.sub(r"\s*\(at line \d+, column \d+\)|\s*\(at end of document\)", "", str(exc))
        named = re.match(r"\s*([A-Za-z0-9_-]+)\s*=", text.splitlines()[line - 1]) if line and \
            line <= len(text.splitlines()) else None
        raise EnvbuilderError(named.group(1) if named else label, f"not valid TOML: {reason}",
                              'write one `key = "value"` per line (strings in double quotes); keys: '
                              + ", ".join(KEYS), line=line, source=str(path)) from None
    lines = text.splitlines()
    out: dict[str, Value] = {}
    for key, raw in parsed.items():
        line = _line_of(lines, key)
        if key not in KEYS:
            close = difflib.get_close_matches(key, list(KEYS), n=1, cutoff=0.6)
            fix = f"did you mean {close[0]}? " if close else ""
            raise EnvbuilderError(key, "not a configuration key",
                                  fix + "known keys: " + ", ".join(KEYS) + " (docs/config.md)",
                                  line=line, source=str(path))
        value = _from_toml(key, raw, path, line)
        where = f"{label} {path}" + (f":{line}" if line else "")
        out[key] = Value(_check(key, value, where, key, base=path.parent, line=line, source=str(path)), where)
    return out


def _line_of(lines: list[str], key: str) -> int | None:
    pattern = re.compile(r"\s*(?:" + re.escape(key) + r'|"' + re.escape(key) + r'"|\'' + re.escape(key)
                         + r"')\s*[=.\]]")
    pattern_table = re.compile(r"\s*\[+\s*" + re.escape(key) + r"\s*[\].]")
    for n, text in enumerate(lines, 1):
        if pattern.match(text) or pattern_table.match(text):
            return n
    return None


def _from_toml(key: str, raw, path: Path, line: int | None) -> str:
    spec = KEYS[key]
    if isinstance(raw, str):
        return raw
    if spec.kind in ("urls", "channels") and isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return (" " if spec.kind == "urls" else ",").join(raw)
    wanted = "a string or a list of strings" if spec.kind in ("urls", "channels") else "a string"
    got = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "a table"}.get(
        type(raw), type(raw).__name__)
    raise EnvbuilderError(key, f"is {got}; it must be {wanted}", f"write it as {key} = {spec.example}",
                          line=line, source=str(path))


URL_RE = re.compile(r"https?://[^\s\x00-\x1f\x7f\"'\\]{1,2048}")


def _check(key: str, value: str, where: str, field: str, *, base: Path | None,
           line: int | None = None, source: str | None = None) -> str:
    """The value as used (paths made absolute from a file's folder), or one message naming it."""
    spec = KEYS[key]

    def bad(reason: str, fix: str) -> EnvbuilderError:
        return EnvbuilderError(field, f"{reason} (set in {where})" if source is None else reason, fix,
                               line=line, source=source)

    if "\x00" in value or len(value) > 4096:
        raise bad("is not a usable value", f"write it as {key} = {spec.example}")
    if spec.kind in ("dir", "file"):
        p = Path(value).expanduser()
        if base is not None and not p.is_absolute():
            p = base / p
        return str(p)
    if spec.kind in ("url", "urls"):
        for url in value.split() if spec.kind == "urls" else [value]:
            if not URL_RE.fullmatch(url):
                raise bad(f"{url[:200]!r} is not an http(s):// URL", f"write it as {key} = {spec.example}")
        return value
    if spec.kind == "mirror":
        return check_mirror(value, bad)
    if spec.kind == "channels":
        parts = [c.strip() for c in value.split(",") if c.strip()]
        if not parts:
            raise bad("names no channel", f"write it as {key} = {spec.example}")
        return ",".join(parts)
    if spec.kind == "runtime":
        runtimes = _runtimes()
        if value not in runtimes:
            close = difflib.get_close_matches(value, runtimes, n=1)
            raise bad(f"{value[:100]!r} is not a runtime", (f"did you mean {close[0]}? " if close else "")
                      + "one of " + ", ".join(runtimes))
        return value
    if not value.strip():
        raise bad("is empty", f"write it as {key} = {spec.example}, or leave the key out")
    return value


def _runtimes() -> list[str]:
    from .spec.schema import RUNTIMES      # the runtimes job.sbatch knows (runtimes/__init__.py)

    return list(RUNTIMES)


def check_mirror(value: str, bad) -> str:
    """A registry mirror as dockerd's registry-mirrors takes it: http(s)://host[:port], no path,
    no login; returned without a trailing slash."""
    parsed = urllib.parse.urlsplit(value.strip())
    fix = 'write it as registry_mirror = "https://mirror.example.org" (or "http://127.0.0.1:5000"): scheme, host, port'
    try:
        port = parsed.port
    except ValueError:
        raise bad(f"{value[:200]!r} has a port that is not a number", fix) from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise bad(f"{value[:200]!r} is not an http:// or https:// URL", fix)
    if parsed.username or parsed.password:
        raise bad("holds a login; a mirror URL takes none (Docker reads logins from its own config)", fix)
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        raise bad(f"{value[:200]!r} has a path; a mirror stands for a whole registry", fix)
    del port
    return value.strip().rstrip("/")


def require_path(cfg: Config, key: str) -> str | None:
    """The file or folder ``key`` names, or None when not set; one message naming the key and where
    it was set when it is missing."""
    value = cfg.get(key)
    if not value:
        return None
    spec = KEYS[key]
    p = Path(value)
    ok = p.is_dir() if spec.kind == "dir" else p.is_file()
    if ok:
        return value
    origin = cfg.origin(key)
    what = "folder" if spec.kind == "dir" else "file"
    field_name = origin.split()[-1] if origin.startswith("command line") else key
    where = "" if origin.startswith("command line") else f" (set in {origin})"
    hint = {"wheelhouse": "a folder that holds .whl files", "ca_bundle": "a PEM bundle, e.g. "
            "/etc/ssl/certs/ca-certificates.crt", "netrc": "a netrc file: machine HOST login USER password TOKEN"}[key]
    change = "" if origin.startswith("command line") else (
        ", or change or remove it there" if not origin.startswith("environment")
        else f", or unset {env_name(key)}")
    raise EnvbuilderError(field_name, f"no such {what}: {value}{where}", f"give {hint}{change}")


# --- `envbuilder config` --------------------------------------------------------------------------

def render_text(cfg: Config) -> str:
    """`envbuilder config`: each key, its value and where it came from, then the files."""
    rows = [(k, v if v is not None else "-", o) for k, v, o in cfg.items()]
    width = max(len(k) for k, _, _ in rows)
    vwidth = min(48, max(len(v) for _, v, _ in rows))
    lines = [f"{k:<{width}}  {v:<{vwidth}}  {o}" for k, v, o in rows]
    lines.append("")
    lines.append("files (read in this order; a later one wins; ENVBUILDER_<KEY> and the command line over both):")
    for f in cfg.files:
        state = "read" if f.read else "not present"
        how = f", named by {f.why}" if f.why == ENV_CONFIG else ""
        lines.append(f"  {f.kind:<4} {f.path} ({state}{how})")
    return "\n".join(lines)


def doc_table() -> str:
    """The key table of docs/config.md (tests/test_config.py checks the page holds it)."""
    lines = ["| key | variable | what | example |", "|---|---|---|---|"]
    for k, spec in KEYS.items():
        default = f" Default: `{spec.default}`." if spec.default else ""
        lines.append(f"| `{k}` | `{env_name(k)}` | {spec.help}.{default} | `{k} = {spec.example}` |")
    return "\n".join(lines)
