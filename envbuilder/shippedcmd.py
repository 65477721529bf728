"""What envbuilder ships besides its code: `envbuilder presets`, `envbuilder sites` and
`envbuilder init --preset NAME`. The presets and site profiles are package data of the wheel
(setup.py); spec/presets.py and slurm/sites.py say where they are found (docs/install.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .errors import EnvbuilderError, escape_controls


def _print_json(data) -> None:
    print(json.dumps(data, indent=2))


# --- presets ---------------------------------------------------------------------------------------

def cmd_presets(args) -> int:
    """Every preset by name (what `build NAME` takes), with its full version set; none is exit 1."""
    from .plan.components import expect
    from .spec.model import load_spec
    from .spec.presets import describe, require_presets, shown
    from .stack import resolve

    rows: list[dict] = []
    for name, path in require_presets().items():
        spec = load_spec(path)
        stack = resolve(spec)
        rows.append({"name": name, "recipe": shown(name)[len("envbuilder's "):], "path": str(path),
                     "summary": describe(spec), "base": stack.base, "versions": expect(stack)})
    if args.json:
        _print_json(rows)
        return 0
    for r in rows:
        v: dict = r["versions"]
        print(f"{r['name']}  ({r['recipe']})")
        print(f"    {r['summary']}")
        extra = [f"base {r['base']}"]
        if v["nccl"]:
            extra.append(f"NCCL {v['nccl']}")
        if v["cudnn"]:
            extra.append(f"cuDNN {v['cudnn']}")
        if v["horovod"]:
            extra.append("Horovod ops " + ",".join(v["horovod"]["operations"]))
        print("    " + "; ".join(extra))
    print(f"{len(rows)} presets: `envbuilder build NAME` builds one, `envbuilder init --preset NAME -o my.yaml` "
          "writes one out to edit")
    return 0


def presets_args(p) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def preset_text(name: str) -> tuple[str, Path]:
    """A preset's file as written (comments and all), for `init --preset`."""
    from .spec.presets import preset_names, unknown

    path = preset_names().get(name)
    if path is None:
        raise unknown(name, f"no preset named {name!r}", "--preset")
    return path.read_text(encoding="utf-8"), path


# --- sites -----------------------------------------------------------------------------------------

def _where(folder: Path) -> str:
    from .slurm.sites import bundled_sites_dir

    if folder == bundled_sites_dir():
        return "envbuilder's sites/"
    if folder == Path("sites"):
        return "./sites/"
    return f"{folder}/ (ENVBUILDER_SITES)"


def site_rows() -> list[dict]:
    """Every profile --site NAME can take, in the order find_site looks; a name found again in a
    later folder is the earlier one's (listed once)."""
    from .slurm.sites import load_site, site_dirs

    rows: list[dict] = []
    seen: set[str] = set()
    for folder in site_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.y*ml")):
            if path.suffix not in (".yaml", ".yml") or path.stem in seen:
                continue
            seen.add(path.stem)
            row = {"name": path.stem, "description": "", "where": _where(folder), "path": str(path), "ok": True}
            try:
                site = load_site(str(path))
                row["description"] = site.description
            except EnvbuilderError as exc:
                row.update(ok=False, error=exc.message())
            rows.append(row)
    return rows


def cmd_sites(args) -> int:
    """The site profiles (`--site NAME`): name, description, where found. Exit 1 when one does not
    load, or when there is none at all (the package's own are missing)."""
    from .slurm.sites import bundled_sites_dir

    rows = site_rows()
    if not list(bundled_sites_dir().glob("*.yaml")):
        raise EnvbuilderError("sites", f"this envbuilder has no site profiles: {bundled_sites_dir()} holds no "
                              "*.yaml (its package data is missing)",
                              "reinstall envbuilder from its wheel or sdist (pipx reinstall envbuilder; "
                              "docs/install.md)", exit_code=1)
    bad = [r for r in rows if not r["ok"]]
    if args.json:
        _print_json({"ok": not bad, "sites": rows})
        return 1 if bad else 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(escape_controls(f"{r['name']:<{width}}  {r['description'] or '(no description)'}  [{r['where']}]"))
    print("--site NAME takes one; looked in, in order: $ENVBUILDER_SITES, ./sites/, envbuilder's own")
    for r in bad:
        print(f"error: {r['error']}", file=sys.stderr)
    return 1 if bad else 0


def sites_args(p) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


# --- init --preset ---------------------------------------------------------------------------------

def init_preset(args, write_new) -> int:
    """`envbuilder init --preset NAME [-o FILE] [--name NEW]`: the preset's text, comments and all,
    written to a new file to edit (an existing file only with --force: write_new, cli.py's)."""
    import re

    from .spec.model import spec_from_doc
    from .spec.presets import shown
    from .spec.yamlsource import parse_yaml_text

    if not args.preset:
        raise EnvbuilderError("init", "no file to read and no preset named",
                              "give a requirements.txt, environment.yml, pyproject.toml or conda environment, "
                              "or --preset NAME (`envbuilder presets` lists them)")
    if args.source:
        raise EnvbuilderError("--preset", f"both a file ({args.source}) and a preset ({args.preset}) given",
                              "give one: FILE to import it, or --preset NAME to start from a preset")
    others = [opt for opt, value in (("--base", args.base), ("--extra", args.extra), ("--gpu", args.gpu),
                                     ("--wheelhouse", args.wheelhouse)) if value]
    if others:
        raise EnvbuilderError("--preset", f"{', '.join(others)} read(s) an imported file, not a preset",
                              "leave it out; edit the written file instead")
    text, _ = preset_text(args.preset)
    name = args.preset
    if args.name:
        text, count = re.subn(r"^name:[^\n]*$", f"name: {args.name}", text, count=1, flags=re.M)
        name = args.name
        assert count == 1, "every preset has a top-level name line"
    out = args.out if args.out != "-" else "<stdout>"
    spec_from_doc(parse_yaml_text(text, out))        # a --name the schema refuses is named before writing
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    write_new(args.out, text, args.force, "-o")
    if args.json:
        _print_json({"ok": True, "spec": args.out, "preset": args.preset, "name": name})
    else:
        print(f"wrote {args.out} from preset {args.preset} ({shown(args.preset)}); its name: {name} "
              f"(output folder images/{name}/; --name to change)"
              f"\n  next: edit it, then envbuilder check {args.out}; envbuilder build {args.out}")
    return 0
