"""Paths and names shared by the image, the recipes, the job script and `verify`: one place.

The smoke suite inside the image (envbuilder/smoke/, stdlib only) cannot import this module; it
keeps its own copy of MANIFEST_IN_IMAGE, and tests/test_architecture.py checks that the two agree.
"""

from __future__ import annotations

PREFIX = "/opt/envbuilder"                      # manifest, smoke suite, build helpers inside the image
MANIFEST_IN_IMAGE = f"{PREFIX}/manifest.json"   # the in-image copy of the output folder's manifest.json
SMOKE_DIR = "envbuilder_smoke"                  # the suite's folder in the build context and the image
VENV = "/opt/venv"                              # the image's Python environment
PACKAGES_DIR = "/opt/packages"                  # the lock's packages group (pip --target), ahead of
                                                # the venv's site-packages on sys.path (components/python.py)
CONDA_PREFIX = "/opt/conda"                     # conda packages (py-rattler), when the spec has any
VERIFY_MANIFEST = f"{PREFIX}/verify-manifest.json"  # `verify` mounts the folder's manifest here
SUITE_MODULE = "envbuilder_smoke"               # `python -m` name of the suite inside an image
HOST_MODULE = "envbuilder.smoke"                # the same suite from a checkout (host runtime)
