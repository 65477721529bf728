"""The charliecloud directory-image cache stays bounded: each conversion is a whole image (1-6 GB)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from envbuilder.errors import EnvbuilderError
from envbuilder.runtimes import charliecloud as ch


def image_tree(path: Path, used: float) -> Path:
    for d in ("dev", "etc", "opt", "usr/bin"):
        (path / d).mkdir(parents=True, exist_ok=True)
    (path / "usr/bin/python3").write_text("x")
    os.utime(path, (used, used))
    return path


def test_the_cache_keeps_the_most_recently_used_and_never_one_in_use(tmp_path):
    now = time.time()
    hours = {f"{i:016x}": now - (i + 2) * 3600 for i in range(6)}       # 2 h ... 7 h since last use
    for name, used in hours.items():
        image_tree(tmp_path / name, used)
    busy = image_tree(tmp_path / "00000000000000ff", now - 600)          # a job started 10 minutes ago
    other = image_tree(tmp_path / "my-own-image", now - 99 * 3600)       # not an entry this module made
    current = tmp_path / f"{5:016x}"                                     # the one just converted (old mtime)
    removed = ch.trim_cache(tmp_path, keep=2, current=current, now=now)
    left = sorted(p.name for p in tmp_path.iterdir())
    # kept: the two most recently used (keep=2), the current one, the foreign folder
    assert {busy.name, f"{0:016x}", current.name, other.name} == set(left)
    assert sorted(p.name for p in removed) == sorted(f"{i:016x}" for i in range(1, 5))
    # beyond KEEP, an entry used within the hour stays (a job may run from it): a newer one is used
    # now, keep=1, and the busy one stays while 0 goes
    image_tree(tmp_path / "00000000000000fe", now - 60)
    assert [p.name for p in ch.trim_cache(tmp_path, keep=1, current=current, now=now)] == [f"{0:016x}"]
    assert busy.exists() and current.exists()


def test_the_cache_size_setting_is_checked(monkeypatch):
    monkeypatch.delenv(ch.CACHE_KEEP_ENV, raising=False)
    assert ch.cache_keep() == ch.CACHE_KEEP_DEFAULT
    monkeypatch.setenv(ch.CACHE_KEEP_ENV, "7")
    assert ch.cache_keep() == 7
    for bad in ("0", "-1", "many"):
        monkeypatch.setenv(ch.CACHE_KEEP_ENV, bad)
        with pytest.raises(EnvbuilderError) as err:
            ch.cache_keep()
        assert ch.CACHE_KEEP_ENV in err.value.message() and "whole number" in err.value.message()
