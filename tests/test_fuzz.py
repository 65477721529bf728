"""Property-based fuzzing (Hypothesis) of the command line on mutated presets: exit 0, or exit 2
with one `error:` message, never an exception or a traceback, never over 2 s per example.

A bounded number of examples here; `tools/fuzz.py` runs 10,000 and prints a table."""

from __future__ import annotations

import sys

from hypothesis import HealthCheck, given, settings

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))

import fuzz  # noqa: E402

EXAMPLES = 150


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(fuzz.cases())
def test_mutated_presets_exit_0_or_one_message_with_exit_2(case):
    text, command, extra = case
    code, took, err = fuzz.run_case(text, command, extra)
    assert fuzz.violation(code, took, err) is None, (command, extra, text[:500], err[-3000:])


def test_the_property_catches_what_it_should():
    """The checker itself: an exception, a silent exit 2 and a slow run are all violations."""
    assert fuzz.violation("exception", 0.1, "Traceback...\n  File \"x.py\", line 1\nValueError: x")
    assert fuzz.violation(2, 0.1, "")
    assert fuzz.violation(1, 0.1, "error: x")
    assert fuzz.violation(0, 2.5, "")
    assert fuzz.violation(2, 0.1, "error: spec: name: ...") is None


# --- the lock as input (tools/fuzz_lock.py) ------------------------------------------------------

import fuzz_lock  # noqa: E402

LOCK_EXAMPLES = 120


@settings(max_examples=LOCK_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(fuzz_lock.cases())
def test_mutated_locks_exit_0_or_one_message_with_exit_2_and_change_nothing(case):
    text, done = case
    code, err, changed = fuzz_lock.run_case(text)
    assert fuzz_lock.violation(code, err, changed) is None, (done, err[-3000:])


def test_the_lock_property_catches_what_it_should():
    assert fuzz_lock.violation("exception", "Traceback", True)
    assert fuzz_lock.violation(2, "error: x\n", True)              # refused, but wrote
    assert fuzz_lock.violation(2, "", False)
    assert fuzz_lock.violation(1, "error: x\n", False)
    assert fuzz_lock.violation(2, "error: x\n", False) is None
