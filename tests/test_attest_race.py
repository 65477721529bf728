"""Read once, check those bytes, use those bytes (issue 47): a concurrent writer swaps the
statement by rename, as fast as it can, between a signed one (A) and an unsigned one (B: the
same text of another stack, or a failed run); every signature path is run many times while it
does, and an unsigned statement never passes:

- `attest check` (the cosign form): B's stack never checks as passed with A's signature;
- the job's gate (the program job.sbatch runs, taken from a rendered job.sbatch and run as the
  script runs it: env -i, absolute paths): never `ok` for B's stack;
- `attest sign`: the bundle it writes always signs A's bytes (a failed statement read in between
  is refused, never signed).

Each loop is bounded in time (ITER_S) and in runs (RUNS); the counts are printed. The real cosign
3.1.1 signs and verifies throughout."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import RECIPES, run_envbuilder
from test_attest import ENV, _site, keys, signed, write_statement  # noqa: F401  (fixtures)

from envbuilder.attest import check as attest_check
from envbuilder.attest import commands
from envbuilder.errors import EnvbuilderError

RUNS = int(os.environ.get("ENVBUILDER_RACE_RUNS", "100"))
ITER_S = float(os.environ.get("ENVBUILDER_RACE_SECONDS", "90"))
CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SWAPPER = r"""
import os, sys
a, b, target = sys.argv[1:4]
tmp = target + ".swap"
while True:
    for src in (a, b):
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        os.link(src, tmp)
        os.replace(tmp, target)
"""


class Swapper:
    """A process renaming A and B over TARGET in a loop, for the length of a `with`."""

    def __init__(self, a: Path, b: Path, target: Path):
        self.argv = [sys.executable, "-c", SWAPPER, str(a), str(b), str(target)]

    def __enter__(self):
        self.proc = subprocess.Popen(self.argv)
        time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def other_stack(att: Path, tmp: Path) -> tuple[Path, Path, str]:
    """(A: a copy of the signed statement, B: the same text of another stack, unsigned, B's stack)."""
    text = att.read_text()
    stack = json.loads(text)["predicate"]["stack"]["id"]
    stack_b = "lock:" + "b" * 64
    a, b = tmp / "A.json", tmp / "B.json"
    a.write_text(text)
    b.write_text(text.replace(stack, stack_b))
    assert a.read_text() != b.read_text()
    return a, b, stack_b


def _loop(what, step) -> dict:
    counts = {"runs": 0, "passed_unsigned": 0, "refused": 0, "ok": 0}
    t0 = time.time()
    while counts["runs"] < RUNS and time.time() - t0 < ITER_S:
        counts["runs"] += 1
        counts[step()] += 1
    counts["seconds"] = round(time.time() - t0, 1)
    print(f"{what}: {counts}")
    return counts


def test_attest_check_never_passes_a_statement_swapped_in(signed, keys, tmp_path):
    image, att = signed
    a, b, stack_b = other_stack(att, tmp_path)
    pub = str(keys["site"][1])

    def step() -> str:
        try:
            attest_check.check_file(str(image), [pub], stack=stack_b)
        except EnvbuilderError:
            return "refused"
        return "passed_unsigned"

    with Swapper(a, b, att):
        counts = _loop("attest check under a swapping writer", step)
    assert counts["passed_unsigned"] == 0, counts
    assert counts["runs"] >= min(RUNS, 20), counts
    # the user's command, once, after: the statement of the signed stack passes, B's is refused
    text_a, text_b = a.read_text(), b.read_text()
    att.unlink()            # the swapper left a hard link to A or B there
    att.write_text(text_a)
    assert run_envbuilder("attest", "check", "--image", str(image), "--key", pub, env=ENV).code == 0
    att.unlink()
    att.write_text(text_b)
    r = run_envbuilder("attest", "check", "--image", str(image), "--key", pub, env=ENV)
    assert r.code == 2 and "attestation: wrong key" in r.err and "Traceback" not in r.err, r.err


def gate_program(tmp_path: Path, pub: Path) -> str:
    """The checking program of a rendered job.sbatch (require, the site's key), as the script holds it."""
    out = tmp_path / "job"
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(out), "--site",
                       str(_site(tmp_path, f"attestation: require\nattestation_keys: [{pub}]\n")))
    assert r.code == 0, r.err
    lines = (out / "job.sbatch").read_text().splitlines()
    start = lines.index("IFS= read -r -d '' ATTEST_PROGRAM <<'ENVBUILDER_GATE' || true") + 1
    return "\n".join(lines[start:lines.index("ENVBUILDER_GATE", start)]) + "\n"


def run_gate(program: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The program as job.sbatch runs it: /usr/bin/env -i PATH=<system> /bin/bash -c PROGRAM."""
    argv = ["/usr/bin/env", "-i", f"PATH={CLEAN_PATH}", "TMPDIR=/tmp", "/bin/bash", "--norc", "--noprofile",
            "-c", program, "envbuilder-gate", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def test_the_job_gate_never_passes_a_statement_swapped_in(signed, keys, tmp_path):
    image, att = signed
    a, b, stack_b = other_stack(att, tmp_path)
    pub = keys["site"][1]
    program = gate_program(tmp_path, pub)
    stack_a = json.loads(a.read_text())["predicate"]["stack"]["id"]
    ok = run_gate(program, "gate", str(image), str(att), stack_a, str(pub))
    assert ok.returncode == 0 and ok.stdout.startswith("ok|"), ok.stdout + ok.stderr

    def step() -> str:
        proc = run_gate(program, "gate", str(image), str(att), stack_b, str(pub))
        if proc.stdout.startswith("ok|"):
            return "passed_unsigned"
        assert proc.returncode == 2 and proc.stdout.startswith("refuse:"), proc.stdout + proc.stderr
        return "refused"

    with Swapper(a, b, att):
        counts = _loop("job gate under a swapping writer", step)
    assert counts["passed_unsigned"] == 0, counts
    assert counts["runs"] >= min(RUNS, 20), counts


def _signed_digest(bundle: Path) -> bytes:
    data = json.loads(bundle.read_text())
    return base64.b64decode(data["messageSignature"]["messageDigest"]["digest"])


def test_attest_sign_signs_only_the_bytes_it_checked(signed, keys, tmp_path, monkeypatch):
    image, att = signed
    a = tmp_path / "A.json"
    a.write_text(att.read_text())
    st = json.loads(a.read_text())
    st["predicate"]["result"] = "failed"
    failed = tmp_path / "F.json"
    failed.write_text(json.dumps(st, indent=1) + "\n")
    want = hashlib.sha256(a.read_bytes()).digest()
    bundle = Path(f"{att}.bundle")
    key = str(keys["site"][0])
    runs = min(RUNS, int(os.environ.get("ENVBUILDER_RACE_SIGN_RUNS", "40")))
    counts = {"runs": 0, "signed_A": 0, "signed_other": 0, "refused": 0}
    t0 = time.time()
    monkeypatch.setenv("COSIGN_PASSWORD", "")
    with Swapper(a, failed, att):
        while counts["runs"] < runs and time.time() - t0 < ITER_S:
            counts["runs"] += 1
            bundle.unlink(missing_ok=True)
            try:
                commands.sign(str(att), key, str(image), "cosign")
            except EnvbuilderError:
                counts["refused"] += 1
                continue
            counts["signed_A" if _signed_digest(bundle) == want else "signed_other"] += 1
    counts["seconds"] = round(time.time() - t0, 1)
    print(f"attest sign under a swapping writer: {counts}")
    assert counts["signed_other"] == 0, counts
    assert counts["signed_A"] > 0, counts


def test_sign_never_writes_its_bundle_through_a_link(signed, keys, tmp_path):
    image, att = signed
    bundle = Path(f"{att}.bundle")
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours\n")
    bundle.unlink()
    bundle.symlink_to(victim)
    r = run_envbuilder("attest", "sign", str(att), "--key", str(keys["site"][0]), "--image", str(image), env=ENV)
    assert r.code == 2 and "is a symbolic link; envbuilder never writes through a link" in r.err, r.err
    assert "Traceback" not in r.err
    assert victim.read_text() == "not yours\n" and bundle.is_symlink()


@pytest.mark.parametrize("planted", ["folder", "fifo"])
def test_sign_refuses_what_is_no_plain_file_at_the_bundle_path(signed, keys, planted):
    image, att = signed
    bundle = Path(f"{att}.bundle")
    bundle.unlink()
    if planted == "folder":
        bundle.mkdir()
    else:
        os.mkfifo(bundle)
    r = run_envbuilder("attest", "sign", str(att), "--key", str(keys["site"][0]), "--image", str(image), env=ENV,
                       timeout=60)
    assert r.code == 2 and "is not a plain file" in r.err and "Traceback" not in r.err, r.err


def test_the_job_gate_binds_its_verdict_to_the_image_it_hashed_under_a_swapping_writer(signed, keys, tmp_path):
    """The image itself swapped by rename (the signed bytes A and other bytes B of the same size)
    while the gate runs: every `ok` names A's digest and A's inode in its fingerprint (what node
    and rank then compare), never B's; the other runs are refused."""
    image, att = signed
    pub = keys["site"][1]
    program = gate_program(tmp_path, pub)
    stack = json.loads(att.read_text())["predicate"]["stack"]["id"]
    a, b = tmp_path / "imgA", tmp_path / "imgB"
    a.write_bytes(image.read_bytes())
    b.write_bytes(os.urandom(a.stat().st_size))
    want = hashlib.sha256(a.read_bytes()).hexdigest()
    inode_a = a.stat().st_ino

    def step() -> str:
        proc = run_gate(program, "gate", str(image), str(att), stack, str(pub))
        if proc.stdout.startswith("ok|"):
            _, digest, fp, _, _ = proc.stdout.strip().split("|")
            if digest != want or int(fp.split()[-1]) != inode_a:
                return "passed_unsigned"
            return "ok"
        assert proc.returncode == 2 and proc.stdout.startswith("refuse:"), proc.stdout + proc.stderr
        return "refused"

    with Swapper(a, b, image):
        counts = _loop("job gate, the image swapped by rename", step)
    assert counts["passed_unsigned"] == 0, counts
