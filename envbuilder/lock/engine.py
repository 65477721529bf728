"""What the lock asks of a container engine, and nothing more (the lock imports no engine: an
object with this shape is handed in; engines/images.py makes one for Docker, podman or buildah).

- ``image(ref)``: the image the engine holds under ``ref`` -- ``{"id": "sha256:...",
  "repo_digests": ["repo@sha256:...", ...]}`` (registry digests only: an image loaded from an
  archive has none) -- or None.
- ``pull(ref)``: fetch ``ref`` (a pinned ``repo@sha256:...``) from its registry; raises
  ``RuntimeError`` with the reason.
- ``run(image, argv, env=None, stderr=True)``: run ``argv`` in a throw-away container of
  ``image`` (an ID ``sha256:...`` or a pinned reference) with network access, and return its
  standard output (with standard error when ``stderr``); raises ``RuntimeError`` with the
  command's error output when it fails.
- ``name``, ``version()``: recorded in the lock's ``resolvers`` (``engine``: which one resolved it).
"""

from __future__ import annotations

from typing import Protocol


class ImageEngine(Protocol):
    name: str

    def version(self) -> str: ...

    def image(self, ref: str) -> dict | None: ...

    def pull(self, ref: str) -> None: ...

    def run(self, image: str, argv: list[str], env: dict[str, str] | None = None,
            stderr: bool = True) -> str: ...


ENGINE_NAMES = ("docker", "podman", "buildah")      # the keys an engine's version is recorded under
