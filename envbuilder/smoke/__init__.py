"""envbuilder's smoke suite: ships inside every image as ``envbuilder_smoke``.

``python -m envbuilder_smoke`` (in an image) or ``python -m envbuilder.smoke`` (on a host)
runs it. Standard library + the framework (+ horovod and the numpy the framework brings) only,
relative imports only, Python >= 3.8.
"""

__version__ = "1"
