"""envbuilder.lock: every pin and every hash of a stack (base image digest, OS packages, source
tarballs, Python packages, conda packages), resolved for the image, and checked on use.

model.py    the Lock and its file format (load/dump, consistency, seals)
base.py     base image tag -> digest (engine, or registry API); local images by ID
apt.py      OS packages against the base image's own index (simulated install in a container)
sources.py  Horovod sdist / MPI tarball sha256 (catalog, checked against PyPI)
pip.py      pip resolution for the image's Python and platform, with sha256
conda.py    conda-lock lockfiles
resolve.py  inputs from a spec, resolution kind by kind, does a lock match a spec
pins.py     pins/ files and locked entries for the recipes (data; no shell)
diff.py     compare two locks or manifests
cli.py      `envbuilder lock`, `envbuilder diff`
"""

from .model import LOCK_NAME, Lock, LockError, dump, load, loads

__all__ = ["LOCK_NAME", "Lock", "LockError", "dump", "load", "loads"]
