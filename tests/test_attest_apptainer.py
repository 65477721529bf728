"""The apptainer form (the statement inside the SIF's signed group) with the real Apptainer 1.4.5
(tools/apptainer-node, as the non-root user builder), on a small SIF Apptainer builds from a
folder in a second: `attest sign --format apptainer` signs a private copy and renames it over the
SIF; `attest check` and the job gate's program read the SIF through one open descriptor; Apptainer's
own reasons are reported as such (an attestation added after signing: `object not signed`, not
`wrong key`); an attestation in an object group of its own is refused (a signature of another
group does not bind it to this file system)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from test_attest import write_statement

from envbuilder.render.sbatch_sections.attestation import GATE_PROGRAM


@pytest.fixture(scope="module")
def node_dir(tmp_path_factory):
    from infra import APPTAINER_NODE, require_apptainer_node

    require_apptainer_node()
    work = tmp_path_factory.mktemp("apptainer-attest")
    os.chmod(work, 0o777)
    (work / "root" / "etc").mkdir(parents=True)
    (work / "root" / "etc" / "hello").write_text("hello\n")
    for name in ("key", "key2"):
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(work / f"{name}.pem")], check=True,
                       capture_output=True)
        subprocess.run(["openssl", "pkey", "-in", str(work / f"{name}.pem"), "-pubout", "-out",
                        str(work / f"pub{name[3:]}.pem")], check=True, capture_output=True)
    (work / "gate.sh").write_text("\n".join(GATE_PROGRAM) + "\n")
    for p in work.rglob("*"):
        os.chmod(p, 0o777 if p.is_dir() else 0o666)

    def run(script: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(APPTAINER_NODE), "-v", str(work), "--", "bash", "-c", f"cd {work} && {script}"],
                              capture_output=True, text=True, timeout=300)

    return work, run


GATE = ('G() { /usr/bin/env -i PATH=/usr/bin:/bin TMPDIR=/tmp /bin/bash --norc --noprofile -c "$(cat gate.sh)" '
        'envbuilder-gate gate "$@"; }; ')


def _sif(node_dir, name: str) -> tuple[Path, str]:
    work, run = node_dir
    proc = run(f"apptainer build -F {name} root/ >/dev/null 2>&1 && chmod 666 {name}")
    assert proc.returncode == 0, proc.stderr
    att = write_statement(work / name)
    os.chmod(att, 0o666)
    return att, json.loads(att.read_text())["predicate"]["stack"]["id"]


def test_apptainer_form_signs_checks_and_gates_the_bytes_it_read(node_dir):
    work, run = node_dir
    att, stack = _sif(node_dir, "x.sif")
    proc = run(f"python -m envbuilder attest sign {att.name} --key key.pem --image x.sif --format apptainer && "
               "python -m envbuilder attest check --image x.sif --key pub.pem --format apptainer && "
               f"python -m envbuilder attest check --image x.sif --key pub2.pem --format apptainer; echo rc=$?; "
               f"{GATE} G x.sif none.att.json {stack} pub.pem; echo gate=$?; G x.sif none.att.json {stack} pub2.pem")
    out = proc.stdout + proc.stderr
    assert "[apptainer signed group]" in proc.stdout and "rc=2" in proc.stdout, out
    assert "error: attestation: wrong key: apptainer verify of x.sif" in proc.stderr, out
    assert "\nok|" in proc.stdout and "gate=0" in proc.stdout, out
    assert "refuse:wrong key: apptainer verify of x.sif" in proc.stdout, out
    assert not list(work.glob(".envbuilder-sign-*")), "the private copy is left behind"


def test_apptainers_own_reasons_are_reported_not_wrong_key(node_dir):
    """Signed first, the attestation added after: Apptainer says `object not signed`; envbuilder
    and the gate say no attestation and Apptainer's reason, not `wrong key`."""
    work, run = node_dir
    att, stack = _sif(node_dir, "late.sif")
    proc = run("apptainer sign --key key.pem late.sif >/dev/null 2>&1 && "
               f"apptainer sif add --datatype 6 --groupid 1 --filename envbuilder-attestation.json late.sif {att.name} && "
               "python -m envbuilder attest check --image late.sif --key pub.pem --format apptainer; "
               f"{GATE} G late.sif none {stack} pub.pem")
    out = proc.stdout + proc.stderr
    assert "error: attestation: no attestation: apptainer verify of late.sif: " in proc.stderr, out
    assert "object not signed" in proc.stderr and "wrong key" not in out, out
    assert "refuse:no attestation: apptainer verify of late.sif: the attestation object is not signed" in proc.stdout, out


def test_an_attestation_in_a_group_of_its_own_is_refused(node_dir):
    work, run = node_dir
    att, stack = _sif(node_dir, "g2.sif")
    proc = run(f"apptainer sif add --datatype 6 --groupid 2 --filename envbuilder-attestation.json g2.sif {att.name} && "
               "apptainer sign --key key.pem g2.sif >/dev/null 2>&1 && apptainer verify --key pub.pem g2.sif && "
               "python -m envbuilder attest check --image g2.sif --key pub.pem --format apptainer; "
               f"{GATE} G g2.sif none {stack} pub.pem")
    out = proc.stdout + proc.stderr
    assert "error: attestation: no attestation: the attestation in g2.sif is in object group 2" in proc.stderr, out
    assert "refuse:no attestation: the attestation in g2.sif is in object group 2" in proc.stdout, out
