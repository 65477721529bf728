"""`envbuilder init`: a user's requirements.txt, environment.yml, pyproject.toml (+ uv.lock /
pylock.toml) or conda environment folder becomes a spec (docs/import.md).

One module per source format (requirements.py, condaenv.py, pyproject.py) reads the file into a
``Found`` (model.py); mapping.py maps it to the spec's keys; the spec written is checked here, as
`envbuilder check` would, before anything is written, and a finding is reported at the line of the
user's file it came from.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import EnvbuilderError, SpecErrors
from .model import Found, refuse


def detect(path: Path, shown: str) -> str:
    """requirements | environment.yml | pyproject.toml | conda env, from the name (a folder: what
    it holds)."""
    try:
        return _detect(path, shown)
    except (OSError, RuntimeError, ValueError) as exc:     # a name too long, a link loop
        why = getattr(exc, "strerror", None) or str(exc)
        raise refuse(shown[:200], None, f"cannot be read ({why[:80]})",
                     "give the path of a requirements.txt, environment.yml, pyproject.toml or a conda "
                     "environment's folder") from None


def _detect(path: Path, shown: str) -> str:
    if path.is_dir():
        if (path / "conda-meta").is_dir():
            return "conda env"
        if (path / "pyproject.toml").is_file():
            return "pyproject.toml"
        raise refuse(shown, None, "is a folder with neither conda-meta/ (a conda environment) nor a pyproject.toml",
                     "give a requirements.txt, environment.yml, pyproject.toml or a conda environment's folder")
    if not path.exists():
        raise refuse(shown, None, "no such file", "give the path of a requirements.txt, environment.yml, "
                     "pyproject.toml or a conda environment's folder")
    name = path.name.lower()
    if name.endswith(".toml"):
        return "pyproject.toml"
    if name.endswith((".yml", ".yaml")):
        return "environment.yml"
    if name.endswith((".txt", ".in")) or "requirements" in name:
        return "requirements"
    raise refuse(shown, None, "is not a file envbuilder init reads (by its name)",
                 "give a requirements*.txt, environment.yml, pyproject.toml or a conda environment's folder")


def read(path: Path, shown: str, extras: tuple[str, ...] = ()) -> Found:
    kind = detect(path, shown)
    if kind == "requirements":
        from .requirements import read_requirements

        return read_requirements(path, shown)
    if kind == "environment.yml":
        from .condaenv import read_environment_yml

        return read_environment_yml(path, shown)
    if kind == "conda env":
        from .condaenv import read_conda_prefix

        return read_conda_prefix(path, shown)
    from .pyproject import read_pyproject

    if path.is_dir():
        path, shown = path / "pyproject.toml", f"{shown.rstrip('/')}/pyproject.toml"
    return read_pyproject(path, shown, extras)


def import_spec(path: str, *, name: str | None = None, base: str | None = None,
                extras: tuple[str, ...] = (), out_name: str = "spec.yaml",
                wheelhouse: str | None = None, gpu: bool = False) -> tuple[str, dict]:
    """The spec's text for the file at ``path``, checked; (text, summary). Raises EnvbuilderError
    (exit 2) naming the user's file and line."""
    from ..compat.catalog import load_catalog
    from ..spec.model import spec_from_doc
    from ..spec.yamlsource import parse_yaml_text
    from ..stack import resolve
    from .mapping import Mapper, origins, to_yaml, wheelhouse_versions

    found = read(Path(path), path, extras)
    if not found.name:      # requirements.txt names no project: the folder it lies in does
        found.name = Path(path).resolve().parent.name
    cat = load_catalog()
    mapper = Mapper(found, cat, wheelhouse_versions(wheelhouse), gpu=gpu)
    data = mapper.run(name, base)
    text = to_yaml(data, mapper, path)
    where = origins(data, mapper)
    try:
        stack = resolve(spec_from_doc(parse_yaml_text(text, out_name)), catalog=cat)
    except EnvbuilderError as exc:
        errors = exc.errors if isinstance(exc, SpecErrors) else [exc]
        mapped = []
        for e in errors:
            field = e.field
            key = max((k for k in where if field == k or field.startswith(k + ".") or field.startswith(k + "[")),
                      key=len, default=None)
            source, line = where.get(key, (path, None)) if key else (path, None)
            mapped.append(EnvbuilderError(f"init: {field}", e.reason, e.fix, line=line, source=source))
        raise SpecErrors(mapped) from None
    summary = {"framework": f"{stack.spec.framework.name} {stack.spec.framework.version}",
               "python": stack.spec.python, "cuda": data.get("cuda"), "mpi": data.get("mpi"),
               "horovod": data.get("horovod"),
               "pip": len((data.get("packages") or {}).get("pip", [])),
               "conda": len((data.get("packages") or {}).get("conda", [])),
               "findings": [f.as_dict() for f in stack.findings]}
    return text, summary
