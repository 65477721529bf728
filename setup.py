"""Ships the presets and the site profiles inside the package, from their one copy in the repository.

recipes/*.yaml become the package folder envbuilder/presets/ and sites/*.yaml envbuilder/sites/ of
the wheel (setuptools' package_dir: the files are read from recipes/ and sites/ at build time, so
the repository holds no second copy). The sdist carries recipes/ and sites/ as they are (package
data of those two packages), so a wheel built from the sdist has them too. Everything else about
the package is in pyproject.toml. Where the code finds them: envbuilder/spec/presets.py
recipes_dir(), envbuilder/slurm/sites.py site_dirs() (docs/install.md).
"""

from setuptools import find_packages, setup

DATA_PACKAGES = {"envbuilder.presets": "recipes", "envbuilder.sites": "sites"}

setup(
    packages=find_packages(include=["envbuilder", "envbuilder.*"]) + list(DATA_PACKAGES),
    package_dir=DATA_PACKAGES,
    package_data={"envbuilder": ["compat/*.yaml", "data/*"],
                  **{name: ["*.yaml"] for name in DATA_PACKAGES}},
)
