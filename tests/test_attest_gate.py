"""The job's attestation gate hardened (issue 47), with the real cosign and, where said, the real
one-node Slurm:

- its environment cannot stand in for its tools: a `BASH_FUNC_cosign%%` function exported into
  the submission, or a `cosign` that always says yes earlier on PATH, does not make a statement
  changed after signing pass (the check runs under env -i, tools by absolute path);
- every legal path name: an image in a folder whose name holds a backslash and a newline passes
  with its valid signed statement (hashed from stdin, never through sha256sum's escaped names);
- the per-node check binds to content: an image rewritten in place, same size, mtime set back,
  is refused at node_setup and at each rank's start (its ctime moved); another file with the same
  bytes on a node (a node-local copy) is hashed there and passes;
- a refusal is one `envbuilder: error: attestation: ...` line, exit 2, nothing run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from test_attest import ENV, _flip, gated_folder, keys, run_job, signed, write_statement  # noqa: F401
from test_attest_race import gate_program, run_gate

import pytest

from conftest import RECIPES, run_envbuilder
from infra import require_binary


def _stack(att: Path) -> str:
    return json.loads(att.read_text())["predicate"]["stack"]["id"]


def test_a_function_or_another_cosign_in_the_submission_cannot_pass_a_changed_statement(signed, keys, tmp_path):
    """Under Slurm: the statement changed after signing, and the submission exports a function
    `cosign` that returns 0 and puts a `cosign` that exits 0 first on PATH. The gate still runs
    the system's cosign on its private copy and refuses (wrong key), nothing run."""
    image, att = signed
    att.write_text(att.read_text().replace('"pass": 28', '"pass": 29', 1))
    folder = gated_folder(tmp_path, "require", keys["site"][1])
    hostile = tmp_path / "hostile-bin"
    hostile.mkdir()
    for name in ("cosign", "sha256sum", "grep"):
        fake = hostile / name
        fake.write_text("#!/bin/sh\necho 'hostile tool ran' >&2\nexit 0\n")
        fake.chmod(0o755)
    env = {"BASH_FUNC_cosign%%": "() { return 0; }", "BASH_FUNC_sha256sum%%": "() { echo 0; }",
           "PATH": f"{hostile}:{os.environ['PATH']}", "ENVBUILDER_IMAGE": str(image)}
    from infra import require_slurm, sbatch_until_done

    require_slurm()
    code, job_id, err = sbatch_until_done(["--output", str(folder / "slurm-%j.out"), str(folder / "job.sbatch")],
                                          cwd=folder, env=env, timeout=240)
    log_file = folder / f"slurm-{job_id}.out"
    log = log_file.read_text() if log_file.is_file() else err
    assert code == 2, log
    assert "envbuilder: error: attestation: wrong key: " in log, log
    assert "hostile tool ran" not in log and "attestation ok" not in log, log
    assert "node_setup" not in log and "[smoke]" not in log, log


def test_the_program_runs_clean_whatever_its_caller_exports(signed, keys, tmp_path):
    """The same, without Slurm: the program run as job.sbatch runs it (/usr/bin/env -i ... /bin/bash)
    from a caller that exports functions for cosign and type and a PATH with a yes-saying cosign:
    none reaches it (without env -i they would: bash imports BASH_FUNC_type%% over the builtin)."""
    image, att = signed
    att.write_text(att.read_text().replace('"pass": 28', '"pass": 29', 1))
    program = gate_program(tmp_path, keys["site"][1])
    hostile = tmp_path / "bin"
    hostile.mkdir()
    (hostile / "cosign").write_text("#!/bin/sh\nexit 0\n")
    (hostile / "cosign").chmod(0o755)
    env = {"PATH": f"{hostile}:/usr/bin:/bin", "BASH_FUNC_cosign%%": "() { return 0; }",
           "BASH_FUNC_type%%": "() { echo /bin/true; }"}
    proc = run_gate(program, "gate", str(image), str(att), _stack(att), str(keys["site"][1]), env=env)
    assert proc.returncode == 2 and proc.stdout.startswith("refuse:wrong key: "), proc.stdout + proc.stderr


def test_every_legal_path_name_passes_with_its_signed_statement(keys, tmp_path):
    """Backslash and newline in the image's folder and name: sha256sum would print an escaped
    line (`\\` + digest) for such a name; the gate hashes stdin, so the valid statement passes,
    and one changed byte is still `digest differs`."""
    odd = tmp_path / "we\\ird\nfolder"
    odd.mkdir()
    image = odd / "x\\y\nz.sif"
    image.write_bytes(os.urandom(64 * 1024))
    att = write_statement(image)
    r = run_envbuilder("attest", "sign", str(att), "--key", str(keys["site"][0]), "--image", str(image), env=ENV)
    assert r.code == 0, r.err
    program = gate_program(tmp_path, keys["site"][1])
    ok = run_gate(program, "gate", str(image), str(att), _stack(att), str(keys["site"][1]))
    assert ok.returncode == 0 and ok.stdout.startswith("ok|"), ok.stdout + ok.stderr
    digest = ok.stdout.split("|")[1]
    assert digest == json.loads(att.read_text())["subject"][0]["digest"]["sha256"]
    _flip(image, 100)
    bad = run_gate(program, "gate", str(image), str(att), _stack(att), str(keys["site"][1]))
    assert bad.returncode == 2 and bad.stdout.startswith("refuse:digest differs: "), bad.stdout


def test_an_image_rewritten_in_place_with_its_times_put_back_is_refused_per_node_and_per_rank(signed, keys, tmp_path):
    image, att = signed
    program = gate_program(tmp_path, keys["site"][1])
    ok = run_gate(program, "gate", str(image), str(att), _stack(att), str(keys["site"][1]))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    _, digest, fp, key, form = ok.stdout.strip().split("|")
    assert form == "cosign bundle" and key == str(keys["site"][1])
    assert run_gate(program, "node", str(image), fp, digest).stdout.startswith("ok|")
    assert run_gate(program, "rank", str(image), fp).stdout.startswith("ok|")
    # same size, same mtime: only the ctime (which no user can set back) shows the change
    st = image.stat()
    _flip(image, 5000)
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert image.stat().st_size == st.st_size and image.stat().st_mtime_ns == st.st_mtime_ns
    node = run_gate(program, "node", str(image), fp, digest)
    assert node.returncode == 2 and node.stdout.startswith("refuse:digest differs: node "), node.stdout
    rank = run_gate(program, "rank", str(image), fp)
    assert rank.returncode == 2 and "changed on" in rank.stdout and "after it was checked" in rank.stdout, rank.stdout
    # the bytes put back: a file with the checked bytes (another inode, a node-local copy) passes
    # on a node by its hash, and the rank then checks against that node's own record
    _flip(image, 5000)
    copy = tmp_path / "node-local.sif"
    copy.write_bytes(image.read_bytes())
    node = run_gate(program, "node", str(copy), fp, digest)
    assert node.returncode == 0 and node.stdout.startswith("ok|"), node.stdout
    assert run_gate(program, "rank", str(copy), node.stdout.strip().split("|", 1)[1]).returncode == 0


@pytest.mark.parametrize("runtime", ["apptainer", "charliecloud", "pyxis"])
def test_the_rendered_job_binds_every_rank_to_the_checked_image(keys, tmp_path, runtime):
    """job.sbatch: node_setup checks after staging, and launch[] starts with the rank's check
    (pyxis, which opens the image inside srun, has only node_setup's)."""
    site = tmp_path / "site.yaml"
    site.write_text(f"name: gated\nruntime: {runtime}\nattestation: require\nattestation_keys: [{keys['site'][1]}]\n")
    out = tmp_path / "job"
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(out), "--site",
                       str(site))
    assert r.code == 0, r.err
    text = (out / "job.sbatch").read_text()
    node = text.index('envbuilder-gate node "$attest_f"')
    if runtime == "apptainer":
        assert text.index("    stage_image\n") < node
    assert ("envbuilder-gate rank" in text) == (runtime != "pyxis")
    if runtime != "pyxis":
        assert "exec \"$@\"' attest-rank \"${launch[@]}\")" in text
    assert "/usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in text
    assert 'sha256sum "$' not in text   # never a name through sha256sum's escaping
    proc = subprocess.run([require_binary("shellcheck"), "-s", "bash", str(out / "job.sbatch")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_a_job_rendered_without_the_lock_accepts_the_image_built_from_it(keys, tmp_path):
    """The docs' key rotation re-renders job folders with `build --no-build`; a folder rendered
    without the image's lock knows only the spec (`spec:` stack) while the image's statement is of
    its lock (`lock:`). The statement also carries the spec's line (gate_spec), so the gate and
    `attest check --folder` accept it; a statement without it names the fix (render with --lock)."""
    from test_attest import MANIFEST, report

    from envbuilder.attest.commands import attest_after_verify

    manifest = json.loads(MANIFEST.read_text())
    manifest["lock"] = {"sha256": "ab" * 32}
    mpath = tmp_path / "manifest.json"
    mpath.write_text(json.dumps(manifest))
    image = tmp_path / "x.sif"
    image.write_bytes(os.urandom(32 * 1024))
    att = Path(f"{image}.att.json")
    attest_after_verify(report(), str(image), mpath, str(att))
    st = json.loads(att.read_text())
    assert st["predicate"]["stack"]["id"] == "lock:" + "ab" * 32 and st["predicate"]["stack"]["spec_id"].startswith("spec:")
    r = run_envbuilder("attest", "sign", str(att), "--key", str(keys["site"][0]), "--image", str(image), env=ENV)
    assert r.code == 0, r.err
    folder = gated_folder(tmp_path, "require", keys["site"][1])      # --no-build, no lock in it
    text = (folder / "job.sbatch").read_text()
    stack = next(l for l in text.splitlines() if l.startswith("ATTEST_STACK=")).split("=", 1)[1]
    assert stack == st["predicate"]["stack"]["spec_id"], (stack, st["predicate"]["stack"])
    program = gate_program(tmp_path, keys["site"][1])
    ok = run_gate(program, "gate", str(image), str(att), stack, str(keys["site"][1]))
    assert ok.returncode == 0 and ok.stdout.startswith("ok|"), ok.stdout + ok.stderr
    r = run_envbuilder("attest", "check", "--image", str(image), "--key", str(keys["site"][1]), "--folder", str(folder))
    assert r.code == 0 and "attestation ok:" in r.out, r.err
    # a statement of another lock's stack AND another spec is still another stack
    other = run_gate(program, "gate", str(image), str(att), "spec:" + "c" * 64, str(keys["site"][1]))
    assert other.returncode == 2 and other.stdout.startswith("refuse:other stack: "), other.stdout
    # a statement written before gate_spec existed: refused, naming the fix
    del st["predicate"]["gate_spec"], st["predicate"]["stack"]["spec_id"]
    from envbuilder.attest.statement import dumps

    att.write_text(dumps(st))
    r = run_envbuilder("attest", "sign", str(att), "--key", str(keys["site"][0]), "--image", str(image), env=ENV)
    assert r.code == 0, r.err
    r = run_envbuilder("attest", "check", "--image", str(image), "--key", str(keys["site"][1]), "--folder", str(folder))
    assert r.code == 2 and "other stack" in r.err and "--no-build --lock" in r.err, r.err


def test_the_charliecloud_job_finds_the_folders_sif_by_default(signed, keys, tmp_path):
    """Under Slurm, no ENVBUILDER_IMAGE: the charliecloud job's default image is the folder's
    <name>/ directory, else its <name>.sif (build --sif), as the docs say; the gate checks that
    .sif (then the random bytes are no SIF, which the job names: nothing ran)."""
    import shutil

    from infra import require_slurm, sbatch_until_done

    require_slurm()
    image, att = signed
    folder = gated_folder(tmp_path, "require", keys["site"][1])
    sif = folder / "cpu-torch-horovod.sif"
    shutil.copy(image, sif)
    shutil.copy(att, f"{sif}.att.json")
    shutil.copy(f"{att}.bundle", f"{sif}.att.json.bundle")
    assert "ENVBUILDER_IMAGE" not in os.environ
    code, job_id, err = sbatch_until_done(["--output", str(folder / "slurm-%j.out"), str(folder / "job.sbatch")],
                                          cwd=folder, env={}, timeout=240)
    log = (folder / f"slurm-{job_id}.out").read_text()
    assert f"attestation ok: {sif} " in log, log


def test_sif_takes_the_folders_built_tag_not_the_spec_default(tmp_path):
    """`envbuilder sif FOLDER` makes the SIF of the image the folder's build made (image.json's
    tag, e.g. build --tag), as verify does: here one the engine lacks, named in the message."""
    from infra import require_binary

    require_binary("siftool", "apt-get install siftool")
    require_binary("tar2sqfs", "apt-get install squashfs-tools-ng")
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "manifest.json").write_text((RECIPES.parent / "images" / "cpu-torch-horovod" / "manifest.json").read_text())
    (folder / "image.json").write_text(json.dumps({"engine": "docker", "tag": "envbuilder/custom-tag-h4:7",
                                                   "id": "sha256:" + "a" * 64}))
    r = run_envbuilder("sif", str(folder))
    assert r.code == 1 and "envbuilder/custom-tag-h4:7" in r.err and "Traceback" not in r.err, r.err
