"""The site's gate (envbuilder/data/attestation-prolog.sh, docs/attestation.md): a Slurm
PrologSlurmctld the submitter cannot skip, run here as slurmctld runs it (root, the job's id and
comment in its environment, the site's settings in a root-owned file), against good and tampered
statements with the real cosign: exit 0 and a root-owned read-only copy of exactly the bytes it
checked; exit 1 with the reason on stderr for a changed statement, a changed image, another key,
no declared image; `warn` says so and exits 0; settings others can write are refused.

Not run under the test clusters' slurmctld: they are shared by every test of the suite, and a
PrologSlurmctld that refuses jobs without a declared image would stop all the others."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from test_attest import _flip, keys, signed  # noqa: F401  (fixtures)

from envbuilder.render.sbatch_sections.attestation import prolog_script

PROLOG = Path(__file__).resolve().parent.parent / "envbuilder" / "data" / "attestation-prolog.sh"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the prolog's settings must be root-owned: run as root")


def test_the_shipped_prolog_is_the_gates_program_and_passes_shellcheck():
    assert PROLOG.read_text() == prolog_script(), (
        "envbuilder/data/attestation-prolog.sh differs from prolog_script(): regenerate it with "
        "python -c 'from envbuilder.render.sbatch_sections.attestation import prolog_script as p; "
        "open(\"envbuilder/data/attestation-prolog.sh\", \"w\").write(p())'")
    assert os.access(PROLOG, os.X_OK)
    from infra import require_binary

    proc = subprocess.run([require_binary("shellcheck"), "-s", "bash", str(PROLOG)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def _conf(tmp_path: Path, pub: Path, policy: str = "require", verified: Path | None = None, mode: int = 0o644) -> Path:
    conf = tmp_path / "attestation-gate.conf"
    conf.write_text(f"keys={pub}\npolicy={policy}\n" + (f"verified_dir={verified}\n" if verified else ""))
    os.chmod(conf, mode)
    return conf


def prolog(conf: Path, image: Path | None, job: str = "4711") -> subprocess.CompletedProcess:
    env = {"SLURM_JOB_ID": job, "PATH": "/usr/bin:/bin"}
    if image is not None:
        env["SLURM_JOB_COMMENT"] = f"envbuilder-image={image}"
    return subprocess.run(["/bin/bash", str(PROLOG), "--conf", str(conf)], capture_output=True, text=True,
                          env=env, timeout=120)


def test_the_prolog_passes_a_signed_image_and_leaves_a_root_owned_copy_of_the_bytes_it_checked(signed, keys, tmp_path):
    image, _ = signed
    verified = tmp_path / "verified"
    r = prolog(_conf(tmp_path, keys["site"][1], verified=verified), image)
    assert r.returncode == 0 and "attestation ok: " in r.stderr, r.stderr
    copy = verified / "4711" / image.name
    assert copy.read_bytes() == image.read_bytes()
    st = copy.stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o444
    assert stat.S_IMODE((verified / "4711").stat().st_mode) == 0o755


@pytest.mark.parametrize("case", ["statement changed", "image changed", "another key", "no image declared",
                                  "no statement"])
def test_the_prolog_refuses(case, signed, keys, tmp_path):
    image, att = signed
    pub = keys["site"][1]
    declared: Path | None = image
    if case == "statement changed":
        att.write_text(att.read_text().replace('"pass": 28', '"pass": 29', 1))
        words = "refused: wrong key: "
    elif case == "image changed":
        _flip(image, 7)
        words = "refused: digest differs: "
    elif case == "another key":
        pub = keys["attacker"][1]
        words = "refused: wrong key: "
    elif case == "no image declared":
        declared = None
        words = "refused: the job declares no image"
    else:
        att.unlink()
        words = "refused: no attestation: "
    r = prolog(_conf(tmp_path, pub, verified=tmp_path / "verified"), declared)
    assert r.returncode == 1 and words in r.stderr, r.stderr
    assert "attestation ok" not in r.stderr


def test_the_prolog_warns_and_lets_the_job_start_under_warn(signed, keys, tmp_path):
    image, att = signed
    att.unlink()
    r = prolog(_conf(tmp_path, keys["site"][1], policy="warn"), image)
    assert r.returncode == 0 and "refused: no attestation: " in r.stderr, r.stderr


def test_the_prolog_refuses_settings_others_can_write(signed, keys, tmp_path):
    image, _ = signed
    r = prolog(_conf(tmp_path, keys["site"][1], mode=0o666), image)
    assert r.returncode == 1 and "is not root-owned or is writable by others" in r.stderr, r.stderr
