"""What a build needs from the command line, as a small frozen object (the CLI makes it from
argparse's Namespace; engines and lockcmd's build orchestration never see argparse)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BuildOptions:
    engine: str = "docker"                   # one of engines.ENGINES
    tag: str | None = None                   # None: envbuilder/<name>:<spec hash>
    ca_bundle: str | None = None             # a build secret, never in a layer
    netrc: str | None = None                 # a private index's login, a build secret like the CA
    wheelhouse: str | None = None            # a bind mount, never in a layer
    wheelhouse_origin: str = ""              # where it was set (config.py origin; "": given directly)
    skip_wheels: tuple[str, ...] = ()        # the wheelhouse's wheels left out of the build (pipeline.py)
    index_url: str | None = None             # the pip index (config pip_index_url); None: PyPI
    extra_index_urls: tuple[str, ...] = ()   # more indexes (config extra_index_url)
    exports: tuple[str, ...] = ()            # buildah/podman: any of engines.buildah.EXPORTS
    check_reproducible: bool = False         # buildah/podman: build twice, compare digests
    no_cache: bool = False                   # --no-cache: Docker builds every step anew (buildah always does)
    conda_lockfile: str | None = None        # the lock step: a conda-lock file instead of resolving
    quiet: bool = False                      # --json: no progress lines
    force: bool = False                      # --force: replace files envbuilder did not write
    push: str | None = None                  # --push REPO[:TAG]: pushed after the build, by digest

    @property
    def wheelhouse_given(self) -> bool:
        """The wheelhouse was asked for on this command (not a site's or user's configuration)."""
        return not self.wheelhouse_origin or self.wheelhouse_origin.startswith("command line")
