"""Measure the payload of an image, from inside it (run with the image's python, stdin or file).

Payload = the bytes no image of this stack can do without:
  venv     the Python environment the stack is installed in: the whole virtual environment
           (sys.prefix) when the interpreter runs in one, else the site-packages folders; and
           any other sys.path folder holding installed distributions (envbuilder's /opt/packages)
  python   the interpreter (realpath of sys.executable) and its standard library (stdlib, lib-dynload)
  mpi      Open MPI's run-time plugins, dlopen'ed, so no ELF lists them: every file under
           /usr/lib/<triplet>/openmpi, /usr/lib/<triplet>/pmix* and /usr/lib/<triplet>/hwloc
           (hwloc loads all its plugins at MPI_Init: xml_libxml, pci, gl, opencl; checked in
           /proc/PID/maps of a rank), excluding headers (*.h) and pkg-config/static/libtool files
           (*.pc, *.a, *.la); plus mpirun/orted
  libs     the shared libraries those files load (the closure `ldd` prints for every ELF file of
           venv, python and mpi), outside the folders already counted
Sizes are apparent sizes (st_size; what a layer tar holds), each inode counted once.
Prints one JSON object: bytes per part, the total, and file counts.
"""

import glob
import json
import os
import subprocess
import sys
import sysconfig

SKIP_SUFFIXES = (".h", ".hpp", ".pc", ".a", ".la")


def walk(root):
    for folder, _dirs, files in os.walk(root):
        for name in files:
            yield os.path.join(folder, name)


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def ldd(paths):
    """The closure of shared libraries the ELF files load (ldd already resolves it transitively)."""
    found = set()
    chunk = 200
    paths = sorted(paths)
    for i in range(0, len(paths), chunk):
        out = subprocess.run(["ldd"] + paths[i:i + chunk], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split("=>")
            target = (parts[1] if len(parts) > 1 else parts[0]).strip().split(" (")[0].strip()
            if target.startswith("/") and os.path.exists(target):
                found.add(os.path.realpath(target))
    return found


def main():
    seen = set()

    def size(files):
        total, count = 0, 0
        for path in files:
            try:
                st = os.lstat(path)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += st.st_size
            count += 1
        return total, count

    if sys.prefix != sys.base_prefix:
        env_roots = [sys.prefix]
    else:
        env_roots = sorted({p for p in sysconfig.get_paths().values() if "-packages" in p and os.path.isdir(p)})
    # a sys.path folder outside those that holds installed distributions is part of the environment
    # too (envbuilder's /opt/packages: the spec's packages, a layer of their own)
    env_roots += sorted({p for p in sys.path if p and os.path.isdir(p)
                         and not any(p == r or p.startswith(r + "/") for r in env_roots)
                         and glob.glob(os.path.join(p, "*.dist-info"))})
    env_files = [p for root in env_roots for p in walk(root)]

    interp = os.path.realpath(sys.executable)
    stdlib = sysconfig.get_paths()["stdlib"]
    py_files = [interp] + [p for p in walk(stdlib) if not any(p.startswith(r + os.sep) for r in env_roots)]

    mpi_roots = sorted(glob.glob("/usr/lib/*/openmpi") + glob.glob("/usr/lib/*/pmix*") + glob.glob("/usr/lib/*/hwloc"))
    mpi_files = [p for root in mpi_roots for p in walk(root) if not p.endswith(SKIP_SUFFIXES)]
    for exe in ("mpirun", "orted", "orterun"):
        for folder in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin"]:
            candidate = os.path.join(folder, exe)
            if os.path.exists(candidate):
                mpi_files.append(os.path.realpath(candidate))
                break

    counted_roots = env_roots + [stdlib] + mpi_roots
    elves = [p for p in env_files + py_files + mpi_files
             if (p.endswith(".so") or ".so." in p or p in (interp,) or "/bin/" in p) and is_elf(p)]
    libs = [p for p in ldd(elves) if not any(p.startswith(r + os.sep) for r in counted_roots)]

    parts = {}
    counts = {}
    for name, files in (("venv", env_files), ("python", py_files), ("mpi", mpi_files), ("libs", libs)):
        parts[name], counts[name] = size(files)
    print(json.dumps({"bytes": parts, "files": counts, "total": sum(parts.values()),
                      "env_roots": env_roots, "mpi_roots": mpi_roots}))


if __name__ == "__main__":
    main()
