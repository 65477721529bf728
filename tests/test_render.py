"""Every preset renders into files that lint clean, parse, and are byte-identical whatever the
directory, time zone or locale; images/ holds them up to date."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from conftest import RECIPES, ROOT
from infra import venv_tool

PRESETS = sorted(RECIPES.glob("*.yaml"))


def _names():
    import yaml

    return {p: yaml.safe_load(p.read_text())["name"] for p in PRESETS}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    from conftest import run_envbuilder_in_process

    root = tmp_path_factory.mktemp("render")
    out = {}
    for preset, name in _names().items():
        r = run_envbuilder_in_process("build", str(preset), "--no-build", "--out", str(root / name))
        assert r.code == 0, r.err
        out[preset.stem] = root / name
    return out


def test_there_are_presets_for_every_required_stack():
    stems = {p.stem for p in PRESETS}
    assert {"tf-horovod-gpu", "torch-horovod-gpu", "intel-tf-cpu", "ngc-tf-horovod", "cpu-torch-horovod", "cpu-tf-horovod"} <= stems


@pytest.mark.parametrize("preset", [p.stem for p in PRESETS])
def test_dockerfile_passes_hadolint(rendered, preset):
    """No finding at all, but DL3008 (apt versions unpinned), which only a lock can settle: the
    lock pins every OS package (tests/test_lock.py)."""
    hadolint = venv_tool("hadolint")
    proc = subprocess.run([hadolint, "--no-color", "--format", "json", str(rendered[preset] / "Dockerfile")],
                          capture_output=True, text=True)
    findings = json.loads(proc.stdout or "[]")
    assert not [f for f in findings if f["code"] != "DL3008"], findings


@pytest.mark.parametrize("preset", [p.stem for p in PRESETS])
def test_job_script_passes_shellcheck(rendered, preset):
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck must be installed (.ci/install-system.sh)"
    proc = subprocess.run([shellcheck, "--shell=bash", str(rendered[preset] / "job.sbatch")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("preset", [p.stem for p in PRESETS])
def test_apptainer_def_parses_with_spython(rendered, preset):
    from spython.main.parse.parsers import SingularityParser

    recipe = SingularityParser(str(rendered[preset] / "Apptainer.def")).recipe
    manifest = json.loads((rendered[preset] / "manifest.json").read_text())
    froms = [stage.fromHeader for stage in recipe.values()]
    assert froms[0] == manifest["image"]["base"]
    assert froms[-1] == manifest["image"]["runtime_base"]
    text = (rendered[preset] / "Apptainer.def").read_text()
    for section in ("%post", "%environment", "%labels", "%help", "%runscript", "%test"):
        assert section in text
    assert "python -m envbuilder_smoke" in text.split("%test", 1)[1]


@pytest.mark.parametrize("preset", [p.stem for p in PRESETS])
def test_the_runscript_is_the_dockerfiles_cmd_as_envbuilders_sif_writes_it(rendered, preset, tmp_path):
    """Apptainer writes a %runscript as `#!/bin/sh`, a blank line, the section's lines (checked
    with Apptainer 1.4.5: tests/test_apptainer.py compares `apptainer inspect --runscript`): the
    definition file's section is, byte for byte, the runscript envbuilder's .sif writer makes from
    the Dockerfile's CMD; run, it does what `docker run IMAGE [ARGS]` does (arguments replace CMD)."""
    from envbuilder.sif.metadata import runscript
    from envbuilder.sif.rootfs import ImageConfig

    text = (rendered[preset] / "Apptainer.def").read_text()
    section = text.split("\n%runscript\n", 1)[1].split("\n\n%", 1)[0]
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", (rendered[preset] / "Dockerfile").read_text(), re.M).group(1))
    assert runscript(ImageConfig(cmd=cmd)) == "#!/bin/sh\n\n" + section + "\n"
    script = tmp_path / "runscript"
    script.write_text(runscript(ImageConfig(cmd=["echo", "cmd"])))
    run = [subprocess.run(["/bin/sh", str(script), *args], capture_output=True, text=True).stdout
           for args in ((), ("echo", "args"))]
    assert run == ["cmd\n", "args\n"]


def test_dockerfile_structure_for_the_gpu_preset(rendered):
    text = (rendered["tf-horovod-gpu"] / "Dockerfile").read_text()
    assert "FROM nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04 AS devel" in text
    assert "FROM nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04 AS runtime" in text
    runtime = text.split("AS runtime", 1)[1]
    # the runtime stage keeps the environment, not the compilers
    assert "COPY --from=devel /opt/venv /opt/venv" in runtime
    assert "COPY --from=devel /opt/openmpi /opt/openmpi" in runtime
    assert not re.search(r"\b(g\+\+|cmake|python3-dev)\b", runtime)
    # every component pinned and commented
    for pinned in ("tensorflow==2.12.1", "horovod==0.28.1 --hash=sha256:", "h5py==3.9.0",
                   "sha256sum -c", "openmpi-4.1.5.tar.bz2"):
        assert pinned in text
    for comment in ("# system:", "# mpi:", "# python:", "# framework:", "# horovod:", "# packages:", "# smoke:"):
        assert comment in text
    # Horovod gets exactly the operations asked for
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in text and "HOROVOD_WITH_MPI=1" in text and "HOROVOD_WITH_GLOO=1" in text
    assert "HOROVOD_WITHOUT_PYTORCH=1" in text
    # manifest and smoke suite go into the image; OCI labels; no curl | sh, no latest
    assert "COPY manifest.json /opt/envbuilder/manifest.json" in text
    assert "COPY envbuilder_smoke /opt/envbuilder/envbuilder_smoke" in text
    assert 'org.opencontainers.image.title="tf-horovod-gpu"' in text
    assert not re.search(r"curl[^\n]*\|\s*(ba)?sh", text)
    assert ":latest" not in text


def test_cpu_tf_preset_sets_the_seed_threading_env(rendered):
    for preset in ("cpu-tf-horovod", "intel-tf-cpu"):
        text = (rendered[preset] / "Dockerfile").read_text()
        assert 'KMP_BLOCKTIME="0"' in text
        assert 'KMP_AFFINITY="granularity=fine,compact,1,0"' in text
        assert 'TF_ENABLE_ONEDNN_OPTS="1"' in text


def test_ngc_preset_adds_only_what_is_missing(rendered):
    text = (rendered["ngc-tf-horovod"] / "Dockerfile").read_text()
    assert text.count("\nFROM ") == 1
    assert "FROM nvcr.io/nvidia/tensorflow:24.01-tf2-py3" in text
    installs = [l for l in text.splitlines() if "pip install" in l or "pip download" in l]
    assert installs and not [l for l in installs if "tensorflow==" in l or "horovod" in l]
    assert "openmpi" not in text.lower().replace("dev.envbuilder.mpi=\"openmpi", "")
    assert "tensorflow-datasets==4.9.4" in text
    manifest = json.loads((rendered["ngc-tf-horovod"] / "manifest.json").read_text())
    exp = manifest["expect"]
    assert exp["framework"]["version"] == "2.14.0"
    assert exp["horovod"]["version"] == "0.28.1"
    assert exp["mpi"] == {"flavor": "openmpi", "version": "4.1.6"}
    assert exp["cuda"] == "12.3" and exp["nccl"] == "2.19.4"


def test_job_script_follows_the_hybrid_model(rendered):
    text = (rendered["tf-horovod-gpu"] / "job.sbatch").read_text()
    assert text.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4",
                 "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=7", "#SBATCH --time=01:00:00",
                 "set -euo pipefail", "srun --mpi=pmix", "apptainer exec --nv",
                 "add_bind /scratch", "add_bind /data", 'NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-ib0}"',
                 "PYTHONNOUSERSITE=1"):
        assert line in text, line
    # no apptainer exec with --cleanenv/--containall (the preflight names them, never passes them)
    assert [line for line in text.splitlines() if " exec " in line and ("--cleanenv" in line or "--containall" in line)
            and not line.lstrip().startswith("#")] == []


def test_manifest_records_expectations(rendered):
    m = json.loads((rendered["cpu-torch-horovod"] / "manifest.json").read_text())
    assert m["schema"] == "envbuilder.manifest/1"
    assert m["expect"]["framework"] == {"name": "pytorch", "module": "torch", "version": "2.13.0+cpu",
                                        "distribution": "torch"}
    assert "cpu_env" not in m["expect"]
    intel = json.loads((rendered["intel-tf-cpu"] / "manifest.json").read_text())["expect"]
    assert intel["framework"]["distribution"] == "intel-tensorflow"
    assert intel["cpu_env"] == {"KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "0",
                                "KMP_SETTINGS": "0", "TF_ENABLE_ONEDNN_OPTS": "1"}
    assert m["expect"]["horovod"]["controllers"] == ["mpi", "gloo"]
    assert m["expect"]["mpi"] == {"flavor": "openmpi", "version": "4.1.4"}
    assert set(m["files"]) == {"Dockerfile", "Apptainer.def", "job.sbatch"}
    assert m["build"]["horovod_patches"] == ["horovod_cxx17", "horovod_release_build"]


def test_output_is_byte_identical_across_dirs_time_zones_and_locales(tmp_path):
    from conftest import run_envbuilder

    spec = RECIPES / "tf-horovod-gpu.yaml"
    copy_dir = tmp_path / "elsewhere" / "deeper"
    copy_dir.mkdir(parents=True)
    shutil.copy(spec, copy_dir / "tf-horovod-gpu.yaml")
    a = run_envbuilder("build", str(spec), "--no-build", "--out", str(tmp_path / "a"))
    b = run_envbuilder("build", "tf-horovod-gpu.yaml", "--no-build", "--out", str(tmp_path / "b"), cwd=copy_dir,
                       env={"TZ": "Pacific/Chatham", "LC_ALL": "C", "LANG": "C", "SOURCE_DATE_EPOCH": "1"})
    assert a.code == 0 and b.code == 0, a.err + b.err
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_images_folder_is_up_to_date(rendered):
    """images/<name>/ holds the generated files of every preset; regenerate with
    `python -m envbuilder build recipes/X.yaml --no-build --out images/<name>`."""
    stale = []
    for preset, name in _names().items():
        fresh = rendered[preset.stem]
        committed = ROOT / "images" / name
        # the recipes and the manifest; the manifest carries the smoke suite's hash, so the
        # suite's copy (not committed) is checked through it
        for path in fresh.iterdir():
            if path.is_file():
                rel = path.relative_to(fresh)
                mine = committed / rel
                if not mine.is_file() or mine.read_bytes() != path.read_bytes():
                    stale.append(f"images/{name}/{rel}")
    assert not stale, "out of date (run tools/regenerate-images.sh): " + ", ".join(stale)


def test_rebuilding_into_an_existing_folder_keeps_other_files(cli, tmp_path):
    out = tmp_path / "out"
    assert cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(out)).code == 0
    (out / "build.log").write_text("keep me")
    (out / "Dockerfile").write_text("old")           # no envbuilder header now: the user's
    r = cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(out))
    assert r.code == 2 and "Dockerfile" in r.err and "--force" in r.err, r.err
    assert (out / "Dockerfile").read_text() == "old"
    assert cli("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--no-build", "--out", str(out), "--force").code == 0
    assert (out / "build.log").read_text() == "keep me"
    assert (out / "Dockerfile").read_text().startswith("# Dockerfile for cpu-torch-horovod")
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_cli_lists_presets_and_schema(cli):
    r = cli("presets", "--json")
    assert r.code == 0, r.err
    rows = json.loads(r.out)
    gpu = next(row for row in rows if row["name"] == "tf-horovod-gpu")
    assert gpu["versions"]["nccl"] == "2.15.5"
    assert gpu["base"] == "nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04"
    text = cli("presets").out
    assert "cpu-torch-horovod" in text and "NCCL 2.15.5" in text
    schema = json.loads(cli("schema").out)
    assert schema["properties"]["framework"]["properties"]["name"]["enum"][0] == "tensorflow"
    assert "name" in schema["required"] and schema["additionalProperties"] is False


def test_schema_accepts_every_preset():
    import jsonschema
    import yaml

    from envbuilder.spec.schema import json_schema

    for preset in PRESETS:
        jsonschema.validate(yaml.safe_load(preset.read_text()), json_schema())


def test_build_prints_what_it_wrote(cli, tmp_path):
    r = cli("build", str(RECIPES / "tf-horovod-gpu.yaml"), "--no-build", "--out", str(tmp_path / "g"))
    assert r.code == 0
    for name in ("Dockerfile", "Apptainer.def", "job.sbatch", "manifest.json"):
        assert f"{tmp_path / 'g' / name}" in r.out


def test_python_dash_m_and_console_script_agree():
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / "envbuilder"      # the venv's console script
    exe = str(beside) if beside.is_file() else shutil.which("envbuilder")
    if exe is None:
        pytest.skip("console script not installed (pip install -e .)")
    proc = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("envbuilder ")


def test_a_rewritten_folder_loses_stale_pins_but_keeps_the_users_files(tmp_path):
    """A lock that lost its packages group must not leave pins/pip-packages.txt behind; files
    envbuilder does not own stay, and a write of the lock alone touches no pins."""
    from envbuilder.output import write_folder

    folder = tmp_path / "out"
    write_folder(folder, {"Dockerfile": b"1", "pins/pip-framework.txt": b"a", "pins/pip-packages.txt": b"b"},
                 complete=True)
    (folder / "notes.txt").write_text("mine")
    write_folder(folder, {"envbuilder.lock": b"{}"})
    assert (folder / "pins" / "pip-packages.txt").is_file()
    write_folder(folder, {"Dockerfile": b"2", "pins/pip-framework.txt": b"a"}, complete=True,
                 force=True)          # "1" has no envbuilder header: the user's file, replaced on --force
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == \
        ["Dockerfile", "envbuilder.lock", "notes.txt", "pins/pip-framework.txt"]


def test_one_file_is_replaced_whole_or_left_as_it_was(tmp_path):
    """output.write_atomic (reports, image.json): the new text whole, readable by others (0666
    less the umask), no temporary file left; a write that fails leaves the old file."""
    import os
    import stat

    from envbuilder.output import write_atomic

    target = tmp_path / "sub" / "report.json"
    write_atomic(target, "old\n")
    write_atomic(target, b"new\n")
    assert target.read_text() == "new\n"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]
    with pytest.raises(TypeError):
        write_atomic(target, 42)            # not text: nothing replaced, nothing left behind
    assert target.read_text() == "new\n"
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]


@pytest.mark.parametrize("base_from,bootstrap,source,header", [
    (None, "docker-daemon", "local/debian:bookworm-slim", None),
    ("registry", "docker", "local/debian:bookworm-slim", None),
    ("docker-daemon", "docker-daemon", "local/debian:bookworm-slim", None),
    ("docker-archive", "docker-archive", "bases/local_debian_bookworm-slim.docker.tar",
     "#   docker save local/debian:bookworm-slim -o bases/local_debian_bookworm-slim.docker.tar"),
    ("oci-archive", "oci-archive", "bases/local_debian_bookworm-slim.oci.tar",
     "#   skopeo copy docker-daemon:local/debian:bookworm-slim oci-archive:bases/local_debian_bookworm-slim.oci.tar"),
])
def test_the_spec_says_where_apptainer_reads_the_bases(tmp_path, base_from, bootstrap, source, header):
    """base_from: every stage's Bootstrap:/From: as the spec asks (auto: a local/ base from the
    Docker engine); an archive is a file of the folder, and the header prints the command that
    writes it. The Dockerfile's FROM stays the image; auto keeps every file as before."""
    from envbuilder.generate import generate
    from envbuilder.spec.model import load_spec

    spec, local = tmp_path / "spec.yaml", tmp_path / "local.yaml"
    # a site's own image, made where the build runs (the presets name public images)
    text = (RECIPES / "cpu-torch-ddp.yaml").read_text().replace("base: debian:bookworm-slim",
                                                                "base: local/debian:bookworm-slim")
    spec.write_text(text + (f"base_from: {base_from}\n" if base_from else ""))
    local.write_text(text)
    files = generate(load_spec(spec)).files
    plain = generate(load_spec(local)).files
    definition = files["Apptainer.def"].decode()
    assert re.findall(r"^Bootstrap: (\S+)\nFrom: (\S+)$", definition, re.M) == [(bootstrap, source)] * 2
    assert (header in definition) if header else "Bases from archives" not in definition
    assert b"bases/" not in files["Dockerfile"] and b"FROM local/debian:bookworm-slim AS devel" in files["Dockerfile"]
    if base_from in (None, "auto"):
        assert files == plain


def test_no_preset_names_a_base_only_this_machine_has():
    """Every preset names a public image (Docker Hub, NVIDIA, NGC): the same file builds here (through
    the set-up's mirror) and on a user's machine, and its definition file pulls the base from the
    registry (Bootstrap: docker), as a login node with Apptainer alone can."""
    import yaml

    local = [p.name for p in PRESETS if "local/" in p.read_text()]
    assert local == [], f"presets naming a local/ image: {local}"
    for preset in PRESETS:
        data = yaml.safe_load(preset.read_text())
        definition = (RECIPES.parent / "images" / data["name"] / "Apptainer.def").read_text()
        froms = re.findall(r"^Bootstrap: (\S+)\nFrom: (\S+)$", definition, re.M)
        assert froms and froms[0][0] == "docker" and froms[0][1] == data.get("base", froms[0][1]), (preset.name, froms)
        assert not froms[0][1].startswith("local/"), (preset.name, froms)


def test_with_a_lock_the_spec_packages_are_a_runtime_layer_after_the_venv_and_come_first_on_sys_path():
    """The lock's packages group installs into /opt/packages (pip --target) and the runtime stage
    copies it after the venv, so a changed pin leaves the venv's COPY cached
    (tests/test_packages_layer.py builds it); a .pth in the venv puts the folder ahead of its
    site-packages, PATH its console scripts ahead of the venv's. Apptainer.def copies the same
    folders. Without a lock the packages go into the venv as before (pip must see what the
    framework installed)."""
    from envbuilder.lock.model import Lock
    from envbuilder.plan.components import assemble
    from envbuilder.render.apptainer import render_apptainer
    from envbuilder.render.dockerfile import render_dockerfile
    from envbuilder.spec.model import load_spec
    from envbuilder.stack import resolve

    def entry(name: str, version: str) -> dict:
        return {"name": name, "version": version, "file": f"{name}-{version}-py3-none-any.whl", "sha256": "0" * 64,
                "from": "index"}

    spec = load_spec(RECIPES / "cpu-torch-horovod.yaml")
    spec = spec.__class__(**{**spec.__dict__, "packages": spec.packages.__class__(
        **{**spec.packages.__dict__, "pip": ["six==1.17.0"]})})
    base = {"ref": "local/debian:bookworm-slim", "digest": "sha256:" + "1" * 64, "kind": "image-id",
            "pinned": "local/debian:bookworm-slim"}
    lock = Lock(name=spec.name, inputs={}, base={"devel": base, "runtime": base}, pip={"python": [entry("pip", "24.0")],
                                                "framework": [entry("torch", "2.13.0+cpu"), entry("six", "1.16.0")],
                                                "packages": [{**entry("six", "1.17.0"), "overrides": "1.16.0"}]})
    plan = assemble(resolve(spec, lock))
    docker = render_dockerfile(plan, "0" * 64)
    site = "/opt/venv/lib/python3.11/site-packages"
    assert "--target /opt/packages --require-hashes --no-deps -r /pins/pip-packages.txt" in docker
    assert f"> {site}/00-envbuilder-packages.pth" in docker
    assert 'site.addsitedir("/opt/packages")' in docker and f'sys.path.index("{site}")' in docker
    # the packages build in a stage on top of devel: the venv's COPY reads devel's snapshot, which a
    # changed pin leaves as it was
    assert docker.index("FROM devel AS packages") < docker.index("--target /opt/packages") < docker.index("AS runtime")
    venv, packages = (docker.index(c) for c in ("COPY --from=devel /opt/venv /opt/venv",
                                                "COPY --from=packages /opt/packages /opt/packages"))
    assert venv < packages < docker.index("COPY manifest.json")
    assert 'PATH="/opt/packages/bin:/opt/venv/bin:$PATH"' in docker
    apptainer = render_apptainer(plan, "0" * 64)
    # Apptainer (no layer cache): one devel stage runs the same steps, the runtime copies both
    assert "Stage: packages" not in apptainer and apptainer.count("Bootstrap:") == 2
    assert "%files from devel\n    /opt/venv /opt/venv\n    /opt/packages /opt/packages\n" in apptainer
    assert "--target /opt/packages" in apptainer and "00-envbuilder-packages.pth" in apptainer

    # a pin change that empties the packages group (six back at the framework's version) leaves
    # the python step, hence every layer up to the packages', as it was
    lock.pip = {**lock.pip, "packages": []}
    empty = render_dockerfile(assemble(resolve(spec, lock)), "0" * 64)
    assert "/opt/packages /opt/packages" not in empty and "/opt/packages/bin" not in empty
    assert "AS packages" not in empty
    python_step = docker[docker.index("# python:"):docker.index("# framework:")]
    assert python_step in empty and "00-envbuilder-packages.pth" in python_step

    unlocked = render_dockerfile(assemble(resolve(spec)), "0" * 64)
    assert "/opt/packages" not in unlocked and "pip install --no-cache-dir --disable-pip-version-check six==1.17.0" in unlocked
