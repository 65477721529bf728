"""/.singularity.d in the root file system, laid out as Apptainer's docker conversion lays it out
(apptainer v1.5.3: internal/pkg/build/sources/base_environment.go for the folders, symlinks,
files and modes; conveyorPacker_oci.go for env/10-docker2singularity.sh, runscript and
labels.json; internal/pkg/build/metadata.go for Singularity, labels.json's build labels and test).
The file names, modes and what each file does follow Apptainer; the text is envbuilder's own.

    /.singularity.d/
        Singularity                 the definition the SIF was made from (docker-daemon header)
        labels.json                 the image's labels + the build labels Apptainer adds
        runscript                   OCI ENTRYPOINT/CMD, as `apptainer run` starts them
        test                        the smoke suite (`apptainer test x.sif`)
        actions/{exec,run,shell,start,test}
        env/01-base.sh 10-docker2singularity.sh 90-environment.sh 95-apps.sh 99-base.sh
            99-runtimevars.sh       10-: the image's ENV, exported as Apptainer does
        libs/                       where Apptainer binds host libraries (--nv)
        runscript.help is not written (no %help)
    /singularity /.run /.exec /.test /.shell /environment   symlinks into it
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from ..errors import CheckFailed
from ..quoting import apptainer_text, metadata_dq, oci_runscript
from . import layers
from .layers import Tree
from .rootfs import ImageConfig

VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")      # Apptainer's variableRegex (fullmatch: no final newline)

SOURCE_ENV = """\
for script in /.singularity.d/env/*.sh; do
    if [ -f "$script" ]; then
        . "$script"
    fi
done
"""

ACTIONS = {
    "exec": "#!/bin/sh\n# apptainer exec: the container's environment, then the command\n"
            + SOURCE_ENV + 'exec "$@"\n',
    "run": "#!/bin/sh\n# apptainer run: the container's environment, then its runscript\n" + SOURCE_ENV
           + 'if [ -x /.singularity.d/runscript ]; then\n    exec /.singularity.d/runscript "$@"\nfi\n'
           + 'echo "no runscript in this container; starting /bin/sh" >&2\nexec /bin/sh "$@"\n',
    "shell": "#!/bin/sh\n# apptainer shell: the container's environment, then an interactive shell\n"
             + SOURCE_ENV
             + 'if [ -n "${SINGULARITY_SHELL:-}" ] && [ -x "$SINGULARITY_SHELL" ]; then\n'
               '    exec "$SINGULARITY_SHELL" "$@"\nfi\n'
             + 'if [ -x /bin/bash ]; then\n    SHELL=/bin/bash\n    export SHELL\n'
               '    exec /bin/bash --norc "$@"\nfi\nSHELL=/bin/sh\nexport SHELL\nexec /bin/sh "$@"\n',
    "start": "#!/bin/sh\n# apptainer instance start: tell the instance's PID 1 to go on, then the startscript\n"
             "kill -CONT 1\n" + SOURCE_ENV
             + 'if [ -x /.singularity.d/startscript ]; then\n    exec /.singularity.d/startscript\nfi\n',
    "test": "#!/bin/sh\n# apptainer test: the container's environment, then its test script\n" + SOURCE_ENV
            + 'if [ -x /.singularity.d/test ]; then\n    exec /.singularity.d/test "$@"\nfi\n'
            + 'echo "no test in this container" >&2\nexec /bin/sh -c true\n',
}

ENV_FILES = {
    "01-base.sh": "#!/bin/sh\n# base environment (empty, as in Apptainer's own)\n",
    "90-environment.sh": "#!/bin/sh\n# the definition file's %environment would follow here (none: built from an image)\n",
    "95-apps.sh": "#!/bin/sh\n# SCIF apps: none in envbuilder images\n",
    "99-base.sh": (
        "#!/bin/sh\n# libraries Apptainer binds from the host (--nv) come last on the search path\n"
        'if [ -z "${LD_LIBRARY_PATH:-}" ]; then\n    LD_LIBRARY_PATH=/.singularity.d/libs\nelse\n'
        '    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/.singularity.d/libs"\nfi\n'
        'if [ -z "${PS1:-}" ]; then\n    PS1="Apptainer> "\nfi\nexport LD_LIBRARY_PATH PS1\n'),
    "99-runtimevars.sh": (
        "#!/bin/sh\n# --env PREPEND_PATH / APPEND_PATH / PATH given at run time\n"
        'if [ -n "${SING_USER_DEFINED_PREPEND_PATH:-}" ]; then PATH="$SING_USER_DEFINED_PREPEND_PATH:$PATH"; fi\n'
        'if [ -n "${SING_USER_DEFINED_APPEND_PATH:-}" ]; then PATH="$PATH:$SING_USER_DEFINED_APPEND_PATH"; fi\n'
        'if [ -n "${SING_USER_DEFINED_PATH:-}" ]; then PATH="$SING_USER_DEFINED_PATH"; fi\n'
        "unset SING_USER_DEFINED_PREPEND_PATH SING_USER_DEFINED_APPEND_PATH SING_USER_DEFINED_PATH\n"
        "export PATH\n"),
}

SYMLINKS = {"singularity": ".singularity.d/runscript", ".run": ".singularity.d/actions/run",
            ".exec": ".singularity.d/actions/exec", ".test": ".singularity.d/actions/test",
            ".shell": ".singularity.d/actions/shell", "environment": ".singularity.d/env/90-environment.sh"}

FOLDERS = (".singularity.d/libs", ".singularity.d/actions", ".singularity.d/env", "dev", "proc",
           "root", "var/tmp", "tmp", "etc", "sys", "home")


def docker_env_script(env: list[str]) -> str:
    """env/10-docker2singularity.sh: the image's ENV. PATH is set as is; every other variable
    keeps a value the caller already has (`${NAME:-"value"}`), as Apptainer's conversion does."""
    lines = ["#!/bin/sh", "# the image's ENV (docker conversion)"]
    for item in env:
        name, sep, value = item.partition("=")
        if not VARIABLE.fullmatch(name):
            continue                                 # Apptainer skips such names too
        if not sep:
            lines.append(f'export {name}="${{{name}:-}}"')
        elif name == "PATH":
            lines.append(f'export PATH="{metadata_dq(value)}"')
        else:
            lines.append(f'export {name}="${{{name}:-"{metadata_dq(value)}"}}"')
    return "\n".join(lines) + "\n"


def runscript(config: ImageConfig) -> str:
    """`apptainer run`: ENTRYPOINT + CMD, arguments replacing CMD (OCI semantics, no eval), written
    as Apptainer writes a definition file's %runscript (`#!/bin/sh`, a blank line, the section's
    lines as the file holds them): for envbuilder's images the very bytes of Apptainer's build."""
    return "#!/bin/sh\n\n" + "".join(f"    {line}\n" for line in oci_runscript(config.entrypoint, config.cmd))


def test_script(suite_module: str, manifest: str) -> str:
    """`apptainer test x.sif`: the smoke suite, as Apptainer.def's %test runs it."""
    return ("#!/bin/sh\n# the envbuilder smoke suite (what Apptainer.def's %test runs)\n"
            f'exec python -m {suite_module} --manifest {manifest} "$@"\n')


def definition(bootstrap: str, source: str) -> bytes:
    """What Apptainer records for `apptainer build x.sif BOOTSTRAP:SOURCE` (a URI build:
    pkg/build/types/definition.go NewDefinitionFromURI keeps just these two header lines)."""
    source = apptainer_text(source, "--archive (its file name)")
    return f"bootstrap: {bootstrap}\nfrom: {source}\n".encode()


def labels(config: ImageConfig, bootstrap: str, source: str, epoch: int, writer: str) -> dict:
    when = datetime.fromtimestamp(epoch, tz=timezone.utc)
    out = dict(config.labels)
    out.update({
        "org.label-schema.schema-version": "1.0",
        "org.opencontainers.image.created": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "org.label-schema.build-date": when.strftime("%A_%-d_%B_%Y_%-H:%-M:%-S_UTC"),
        "org.label-schema.usage.singularity.deffile.bootstrap": bootstrap,
        "org.label-schema.usage.singularity.deffile.from": source,
        "org.opencontainers.image.architecture": config.architecture,
        "org.label-schema.build-arch": config.architecture,
        "dev.envbuilder.sif-writer": writer,
    })
    return dict(sorted(out.items()))


def insert(tree: Tree, config: ImageConfig, *, deffile: bytes, label_map: dict, suite_module: str,
           manifest: str) -> None:
    """/.singularity.d and its links, into the image's TREE (layers.py; nothing on disk).

    /.singularity.d is the SIF's own: any link or file the image has on the way is replaced by a
    real folder, and the files replace what the image had there, so an image cannot send them
    elsewhere. The folders Apptainer expects (dev, proc, etc...) and the bind targets
    /etc/hosts, /etc/resolv.conf are added only where the image lacks them: a link of the image
    that leads to a folder of the image is followed (inside the tree), one that leads nowhere in
    the image is replaced by a folder. The six links at / replace a link of the image, not a
    file or folder."""
    for folder in FOLDERS:
        layers.ensure_folder(tree, folder, follow=not folder.startswith(".singularity.d"))
    for name, target in SYMLINKS.items():
        node = tree.root.children.get(name)
        if node is None or node.kind == "symlink":
            layers.add_symlink(tree, name, target)
    for name in ("etc/hosts", "etc/resolv.conf"):       # bind targets Apptainer expects
        try:
            present = tree.get(name) is not None
        except CheckFailed:                              # a link loop on the way
            present = False
        if not present:
            layers.add_file(tree, name, b"", 0o644, follow_parents=True)
    sd = ".singularity.d"
    files = [(f"{sd}/actions/{name}", text, 0o755) for name, text in ACTIONS.items()]
    files += [(f"{sd}/env/{name}", text, 0o755) for name, text in ENV_FILES.items()]
    files += [(f"{sd}/env/10-docker2singularity.sh", docker_env_script(config.env), 0o755),
              (f"{sd}/runscript", runscript(config), 0o755),
              (f"{sd}/startscript", "#!/bin/sh\n", 0o755),
              (f"{sd}/test", test_script(suite_module, manifest), 0o755),
              (f"{sd}/Singularity", deffile, 0o644),
              (f"{sd}/labels.json", json.dumps(label_map, indent="\t"), 0o644)]
    for path, text, mode in files:
        layers.add_file(tree, path, text.encode() if isinstance(text, str) else text, mode)
