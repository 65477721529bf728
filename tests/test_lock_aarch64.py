"""The lock for an aarch64 image (issue 37): wheels for the image's machine, not the host's, and a
pin without an aarch64 build refused by name. Reaches PyPI (pip --dry-run --report, no download)."""

import pytest

from envbuilder.errors import EXIT_BAD_INPUT, EnvbuilderError
from envbuilder.lock import pip as pip_

AARCH64 = pip_.target("3.11", "2.36", "aarch64")   # Debian 12's Python and glibc


def test_aarch64_target_asks_aarch64_platforms_only():
    assert AARCH64["markers"]["platform_machine"] == "aarch64"
    assert AARCH64["platforms"][0] == "manylinux_2_36_aarch64"
    assert "manylinux_2_17_aarch64" in AARCH64["platforms"] and "manylinux2014_aarch64" in AARCH64["platforms"]
    assert not [p for p in AARCH64["platforms"] if "x86_64" in p]


def test_aarch64_lock_picks_aarch64_wheels():
    got = pip_.resolve({"packages": ["numpy==2.1.3"]}, AARCH64)
    (entry,) = got["packages"]
    assert entry["file"] == "numpy-2.1.3-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"
    # PyPI's sha256 of that file (the x86_64 wheel's differs)
    assert entry["sha256"] == "762479be47a4863e261a840e8e01608d124ee1361e48b96916f38b119cfda04a"


def test_pin_without_aarch64_build_is_refused_by_name():
    # intel-openmp publishes x86_64 (and Windows) wheels only
    with pytest.raises(EnvbuilderError) as err:
        pip_.resolve({"packages": ["intel-openmp==2024.2.1"]}, AARCH64)
    assert err.value.exit_code == EXIT_BAD_INPUT == 2
    text = str(err.value)
    assert "intel-openmp 2024.2.1 has no aarch64 build" in text and "--wheelhouse" in text
