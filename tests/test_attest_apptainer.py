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


def test_the_gate_on_the_two_node_apptainer_cluster_binds_every_node_and_rank(node_dir):
    """The real job under Slurm 24.11 on 2 nodes with the real Apptainer (no cosign there): a
    small SIF (Debian slim, by Apptainer from the engine) signed in its group passes the gate; the
    ranks start through the per-rank check; staged (ENVBUILDER_STAGE_IMAGE=1), every node hashes
    its node-local copy and passes; an image rewritten in place after signing is refused."""
    import shutil
    import time

    from apptainer_build import BUILDER_UID, chown_tree
    from conftest import RECIPES, run_envbuilder
    from infra import (APPTAINER_CLUSTER_ROOT, BASE_IMAGE, apptainer_sbatch_until_done, require_apptainer_cluster)

    require_apptainer_cluster()
    work, run = node_dir
    proc = subprocess.run([str(Path(__file__).resolve().parent.parent / "tools" / "apptainer-node"), "-v", str(work),
                           "--", "bash", "-c", f"cd {work} && apptainer build -F slim.sif docker-daemon://{BASE_IMAGE} "
                           ">/dev/null 2>&1 && chmod 666 slim.sif"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    att = write_statement(work / "slim.sif")
    os.chmod(att, 0o666)
    proc = run(f"python -m envbuilder attest sign {att.name} --key key.pem --image slim.sif --format apptainer")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shared = Path(APPTAINER_CLUSTER_ROOT) / "shared" / "tests" / f"attest-h4-{os.getpid()}-{time.strftime('%H%M%S')}"
    shared.mkdir(parents=True)
    try:
        shutil.copy(work / "slim.sif", shared / "signed.sif")
        shutil.copy(work / "pub.pem", shared / "site.pub")
        site = (Path(__file__).resolve().parent.parent / "sites" / "minicluster-apptainer.yaml").read_text()
        profile = shared / "site.yaml"
        profile.write_text(site + f"\nattestation: require\nattestation_keys: [{shared / 'site.pub'}]\n")
        r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out",
                           str(shared / "job"), "--site", str(profile))
        assert r.code == 0, r.err
        chown_tree(shared, BUILDER_UID)

        def job(env: dict) -> tuple[int, str]:
            code, job_id, err = apptainer_sbatch_until_done(
                ["--nodes", "2", "--ntasks-per-node", "1", "job.sbatch", "cat", "/etc/debian_version"], shared / "job",
                env={"ENVBUILDER_IMAGE": str(shared / "signed.sif"), **env}, timeout=300)
            out = shared / "job" / f"cpu-torch-horovod-{job_id}.out"
            return code, (out.read_text() if out.is_file() else err)

        t0 = time.time()
        code, log = job({})
        assert code == 0 and "attestation ok:" in log and "apptainer verify: signed group" in log, log[-3000:]
        assert log.count("12.") >= 2, log[-2000:]      # both ranks ran the image (Debian 12)
        print(f"2-node gated job (apptainer form, small SIF): {time.time() - t0:.1f} s")
        code, log = job({"ENVBUILDER_STAGE_IMAGE": "1"})
        assert code == 0 and "attestation ok:" in log and log.count("12.") >= 2, log[-3000:]
        assert "staged the image" in log, log[-2000:]
        # rewritten in place after signing (one byte of the file system), times put back: refused
        st = (shared / "signed.sif").stat()
        _flip_at(shared / "signed.sif", st.st_size - 100)
        os.utime(shared / "signed.sif", ns=(st.st_atime_ns, st.st_mtime_ns))
        code, log = job({})
        assert code == 2 and "envbuilder: error: attestation: " in log and "12." not in log, log[-2000:]
        print(log.strip().splitlines()[-1])
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _flip_at(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 1]))
