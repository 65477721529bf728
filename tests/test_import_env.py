"""`envbuilder init` (issue 36): a user's requirements.txt, environment.yml, pyproject.toml (+ uv.lock)
or conda environment folder becomes a spec that `check` accepts, or one message naming the file and
line and the fix (exit 2, nothing written); ranges in packages.pip are pinned by the lock's pip
resolution; `envbuilder export` writes a lock back out. Fast: no engine; one pip resolution (PyPI)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_envbuilder, run_envbuilder_in_process

DATA = ROOT / "tests" / "data" / "import"


def _init(tmp_path: Path, source: Path, *extra: str, in_process: bool = True):
    out = tmp_path / "spec.yaml"
    run = run_envbuilder_in_process if in_process else run_envbuilder
    r = run("init", str(source), "-o", str(out), *extra)
    return r, out


def _refused(tmp_path, source: Path, *needles: str, line: int | None = None, where: Path | None = None):
    r, out = _init(tmp_path, source)
    assert r.code == 2, (r.out, r.err)
    assert "Traceback" not in r.err and r.err.startswith("error: "), r.err
    assert len([ln for ln in r.err.splitlines() if ln.startswith("error:")]) == 1, r.err
    for needle in needles:
        assert needle in r.err, r.err
    if line is not None:
        assert f"{where or source}:{line}:" in r.err, r.err
    assert "fix:" in r.err, r.err
    assert not out.exists(), "a refused import writes nothing"
    return r.err


# --- the three real-world files (tests/data/import: each names its source and license) -----------

def test_a_public_requirements_file_with_ranges_becomes_a_spec_check_accepts(tmp_path):
    src = DATA / "hf-text-classification-requirements.txt"
    started = time.monotonic()
    r, out = _init(tmp_path, src, "--name", "hf-text", in_process=False)
    took = time.monotonic() - started
    assert r.code == 0, r.err
    spec = yaml.safe_load(out.read_text())
    assert spec["framework"]["name"] == "pytorch" and spec["framework"]["version"].endswith("+cpu")
    assert spec["python"] == "3.11"
    assert "datasets >= 1.8.0" in spec["packages"]["pip"] and "sentencepiece != 0.1.92" in spec["packages"]["pip"]
    text = out.read_text()
    assert f"# {src}:5" in text                       # each kept line names where it came from
    assert f"{src}:10: torch >= 1.3" in text
    check = run_envbuilder("check", str(out))
    assert check.code == 0, check.err
    print(f"hf requirements -> spec in {took:.2f} s")


def test_a_public_pyproject_becomes_a_spec_with_its_optional_group(tmp_path):
    src = DATA / "litgpt-pyproject.toml"
    r, out = _init(tmp_path, src, "--extra", "test", in_process=False)
    assert r.code == 0, r.err
    spec = yaml.safe_load(out.read_text())
    assert spec["name"] == "litgpt" and spec["framework"]["name"] == "pytorch"
    assert spec["python"] == "3.11"                   # requires-python = ">=3.10": the default base's
    pip = spec["packages"]["pip"]
    assert "psutil==7.2.2" in pip and any(p.startswith("pytest") for p in pip)
    assert any(p.startswith("jsonargparse[signatures]") and "python_version" in p for p in pip)
    assert run_envbuilder("check", str(out)).code == 0


def test_a_public_workshop_environment_yml_is_refused_naming_the_second_framework(tmp_path):
    # conda's pytorch=1.12.0 and pip's tensorflow-gpu==2.10.0 in one environment
    _refused(tmp_path, DATA / "perlmutter-horovod-environment.yml", "tensorflow-gpu==2.10.0 beside pytorch=1.12.0",
             "one framework", line=137)


def test_the_workshop_environment_with_one_framework_maps_conda_parts_to_the_spec(tmp_path):
    text = (DATA / "perlmutter-horovod-environment.yml").read_text()
    # as the README of that repository would have it today: one framework (the catalog's PyTorch 2.0
    # with CUDA 11.8, recipes/torch-horovod-gpu.yaml), Horovod from pip
    text = text.replace("    - tensorflow-gpu==2.10.0\n", "").replace("pytorch=1.12.0=py3.10_cuda11.3_cudnn8.3.2_0",
                                                                       "pytorch=2.0.1=py3.10_cuda11.8_cudnn8.7.0_0")
    text = text.replace("cudatoolkit=11.3.1=h2bc3f7f_2", "cudatoolkit=11.8.0=h2bc3f7f_2")
    src = tmp_path / "environment.yml"
    src.write_text(text.replace("  - pip:\n    - absl-py", "  - pip:\n    - horovod==0.28.1\n    - absl-py", 1))
    r, out = _init(tmp_path, src)
    assert r.code == 0, r.err
    spec = yaml.safe_load(out.read_text())
    assert spec["framework"] == {"name": "pytorch", "version": "2.0.1"}
    assert spec["python"] == "3.10" and spec["cuda"] == {"version": "11.8"}
    assert spec["horovod"]["operations"] == ["nccl", "mpi", "gloo"] and spec["mpi"]["flavor"] == "openmpi"
    assert "torchvision==0.13.0" in spec["packages"]["pip"]          # conda's, installed by pip
    assert "numpy=1.23.4" in spec["packages"]["conda"]
    assert not any(c.startswith("_") for c in spec["packages"]["conda"])
    # its channels, in order, less Anaconda's `defaults` (a site names its mirror of that)
    assert spec["packages"]["conda_channels"] == ["pytorch"]
    assert "channel defaults not kept" in out.read_text()


# --- mapping to the spec's own keys --------------------------------------------------------------

def _req(tmp_path, text: str, name: str = "requirements.txt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_stack_parts_map_to_spec_keys_and_rules_apply(tmp_path):
    src = _req(tmp_path, "tensorflow==2.15.1  # the framework\nhorovod>=0.28\nopenmpi==5.0.11\nmpi4py>=4\n"
                         "pandas>=2,<3\n")
    r, out = _init(tmp_path, src)
    assert r.code == 0, r.err
    spec = yaml.safe_load(out.read_text())
    assert spec["framework"] == {"name": "tensorflow", "version": "2.15.1"}
    assert spec["horovod"] == {"version": "0.28.1", "operations": ["mpi", "gloo"]}
    assert spec["mpi"] == {"flavor": "openmpi", "version": "5.0.11", "source": "pypi", "pmi": "pmix"}
    assert spec["packages"]["pip"] == ["mpi4py>=4", "pandas>=2,<3"]


def test_nvidia_wheels_make_a_gpu_spec_with_cuda_from_pypi(tmp_path):
    src = _req(tmp_path, "torch==2.13.0\nnvidia-nccl-cu13\nhorovod==0.28.1\n")
    r, out = _init(tmp_path, src)
    assert r.code == 0, r.err
    spec = yaml.safe_load(out.read_text())
    assert spec["cuda"] == {"version": "13.0", "source": "pypi"}
    assert spec["horovod"]["operations"] == ["nccl", "mpi", "gloo"]
    assert "packages" not in spec                     # NVIDIA's wheels come with the framework


@pytest.mark.parametrize("lockname, table", [("uv.lock", "package"), ("pylock.toml", "packages")])
def test_a_lock_beside_pyproject_pins_its_dependencies(tmp_path, lockname, table):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "trainer"\nrequires-python = ">=3.11"\n'
                                             'dependencies = [\n  "torch>=2.1",\n  "numpy>=1.26",\n]\n')
    (tmp_path / lockname).write_text(f'version = 1\n[[{table}]]\nname = "numpy"\nversion = "1.26.4"\n'
                                     f'[[{table}]]\nname = "torch"\nversion = "2.13.0"\n')
    r, out = _init(tmp_path, tmp_path, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["framework"] == "pytorch 2.13.0+cpu"
    spec = yaml.safe_load(out.read_text())
    assert spec["framework"]["version"] == "2.13.0+cpu" and spec["packages"]["pip"] == ["numpy==1.26.4"]
    assert "pinned from" in out.read_text() and lockname in out.read_text()


def test_gpu_asks_for_cuda_from_pypi_where_the_file_names_none(tmp_path):
    r, out = _init(tmp_path, DATA / "litgpt-pyproject.toml", "--gpu")
    assert r.code == 0, r.err
    spec = yaml.safe_load(out.read_text())
    assert spec["framework"] == {"name": "pytorch", "version": "2.15.0"}
    assert spec["cuda"] == {"version": "13.2", "source": "pypi"}
    # a range: the newest release whose NVIDIA wheels the catalog knows
    r, out = _init(tmp_path, _req(tmp_path, "torch>=2.1,<2.14\nhorovod\n"), "--gpu", "--force")
    spec = yaml.safe_load(out.read_text())
    assert spec["framework"]["version"] == "2.13.0" and spec["horovod"]["operations"] == ["nccl", "mpi", "gloo"]
    r = run_envbuilder_in_process("init", str(_req(tmp_path, "tensorflow-cpu\n", "cpu.txt")), "--gpu",
                                  "-o", str(tmp_path / "cpu.yaml"))
    assert r.code == 2 and "cpu.txt:1:" in r.err and "is a CPU build" in r.err and not (tmp_path / "cpu.yaml").exists()


def test_a_cuda_build_label_gives_its_cuda_base_python_and_index(tmp_path):
    src = _req(tmp_path, "--extra-index-url https://download.pytorch.org/whl/cu118\ntorch==2.1.0+cu118\n"
                         "horovod==0.28.1\n")
    r, out = _init(tmp_path, src)
    assert r.code == 0, r.err
    spec = yaml.safe_load(out.read_text())
    assert spec["framework"]["index_url"] == "https://download.pytorch.org/whl/cu118"
    assert spec["cuda"] == {"version": "11.8"} and spec["python"] == "3.10"       # ubuntu22.04's
    assert spec["horovod"]["operations"] == ["nccl", "mpi", "gloo"]
    assert f"{src}:1: index https://download.pytorch.org/whl/cu118 not kept" in out.read_text()


def test_a_conda_environment_folder(tmp_path):
    env = tmp_path / "envs" / "train"
    (env / "conda-meta").mkdir(parents=True)
    for name, version, asked in (("python", "3.11.9", "python=3.11"), ("pytorch", "2.13.0", "pytorch"),
                                 ("libzlib", "1.3.1", ""), ("h5py", "3.11.0", "h5py")):
        (env / "conda-meta" / f"{name}-{version}-0.json").write_text(json.dumps(
            {"name": name, "version": version, "requested_spec": asked}))
    site = env / "lib" / "python3.11" / "site-packages"
    for dist, installer, requested in (("tqdm-4.66.4", "pip", True), ("six-1.16.0", "pip", False),
                                       ("numpy-1.26.4", "conda", True)):
        info = site / f"{dist}.dist-info"
        info.mkdir(parents=True)
        (info / "INSTALLER").write_text(installer + "\n")
        if requested:
            (info / "REQUESTED").write_text("")
    r, out = _init(tmp_path, env)
    assert r.code == 0, r.err
    spec = yaml.safe_load(out.read_text())
    assert spec["name"] == "train" and spec["python"] == "3.11"
    assert spec["framework"] == {"name": "pytorch", "version": "2.13.0+cpu",
                                 "index_url": "https://download.pytorch.org/whl/cpu"}
    assert spec["packages"] == {"pip": ["tqdm==4.66.4"], "conda": ["h5py=3.11.0"]}


# --- refusals: one message naming FILE:LINE and the fix, exit 2, nothing written ----------------

@pytest.mark.parametrize("text, line, needles", [
    ("tensorflow==2.14.0\nintel-tensorflow==2.14.0\n", 2, ["beside tensorflow==2.14.0", "both install"]),
    ("torch==2.13.0\nopenmpi==5.0.11\nmpich==5.0.2\n", 3, ["second MPI"]),
    ("tensorflow-cpu==2.15.1\nnvidia-cudnn-cu12==8.9.4.25\n", 2, ["CUDA part", "CPU image"]),
    ("torch==2.13.0+cpu\nnvidia-nccl-cu13\n", 2, ["CUDA part"]),
    ("torch==1.0.0\n", 1, ["catalog knows no pytorch 1.0.0"]),
    ("torch>=9\n", 1, ["no pytorch release the catalog knows"]),
    ("torch==2.1.0+rocm5.6\n", 1, ["+rocm5.6 build is none envbuilder builds"]),
    ("torch==2.13.0\nhorovod==0.20.0\n", 2, ["no Horovod 0.20.0"]),
    ("torch==2.13.0\n-e .\n", 2, ["editable install", "--wheelhouse"]),
    ("torch==2.13.0\n./pkgs/mylib\n", 2, ["local path"]),
    ("torch==2.13.0\nmylib @ file:///home/me/mylib\n", 2, ["local path"]),
    ("torch==2.13.0\nmylib @ git+https://example.org/me/mylib.git\n", 2, ["without a pinned commit"]),
    ("torch==2.13.0\ngit+https://example.org/me/mylib.git@main#egg=mylib\n", 2, ["without a pinned commit"]),
    ("torch==2.13.0\nimpi-rt==2021.12\n", 2, ["cluster.site_mpi"]),
    ("torch==2.13.0\nnumpy>==1\n", 2, ["not a requirement pip reads"]),
    ("[project]\nname = 'x'\n", 1, ["looks like TOML"]),
    ("name: env\ndependencies: [torch]\n", 1, ["looks like YAML"]),
    ("numpy==1.26.4\n", None, ["names no framework"]),
])
def test_refusals_name_the_line_and_the_fix(tmp_path, text, line, needles):
    _refused(tmp_path, _req(tmp_path, text), *needles, line=line)


def test_a_finding_of_the_rules_is_reported_at_the_users_line(tmp_path):
    # intel-tensorflow 2.14 needs Python <= 3.11: asked 3.12 in the environment file
    src = _req(tmp_path, "dependencies:\n  - python=3.12\n  - pip:\n    - intel-tensorflow>=2.10\n", "environment.yml")
    err = _refused(tmp_path, src, "no intel-tensorflow release the catalog knows is in that range for Python 3.12",
                   line=4)
    assert "init" in err


def test_hostile_inputs(tmp_path):
    big = _req(tmp_path, "torch==2.13.0\n" + "# padding\n" * 200_000, "big-requirements.txt")
    _refused(tmp_path, big, "more than a requirements file can be")
    (tmp_path / "a.txt").write_text("torch==2.13.0\n-r b.txt\n")
    (tmp_path / "b.txt").write_text("-r a.txt\n")
    _refused(tmp_path, tmp_path / "a.txt", "a loop", line=1, where=tmp_path / "b.txt")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "requirements.txt").write_text("torch==2.13.0\n-r ../secret.txt\n")
    _refused(tmp_path, tmp_path / "sub" / "requirements.txt", "not a file in the same folder", line=2)
    (tmp_path / "sub" / "r3.txt").write_text("torch==2.13.0\n\n-r missing.txt\n")
    _refused(tmp_path, tmp_path / "sub" / "r3.txt", "which is not a file there", line=3)
    (tmp_path / "sub" / "link.txt").symlink_to(tmp_path / "a.txt")
    (tmp_path / "sub" / "r4.txt").write_text("-r link.txt\n")
    _refused(tmp_path, tmp_path / "sub" / "r4.txt", "not a file in the same folder", line=1)
    (tmp_path / "sub" / "r2.txt").write_text("-r /etc/passwd\n")
    _refused(tmp_path, tmp_path / "sub" / "r2.txt", "not a file in the same folder", line=1)
    bomb = "dependencies:\n  - &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"  - &{chr(98 + n)} [" + ", ".join([f"*{chr(97 + n)}"] * 9) + "]\n" for n in range(8))
    started = time.monotonic()
    _refused(tmp_path, _req(tmp_path, bomb, "environment.yml"), "expands to more than")
    assert time.monotonic() - started < 5
    _refused(tmp_path, _req(tmp_path, "name: x\ndependencies: !!python/name:os.system x\n", "env.yml"), "tag")
    (tmp_path / "bin-requirements.txt").write_bytes(b"torch\x00\x01")
    _refused(tmp_path, tmp_path / "bin-requirements.txt", "binary file")
    _refused(tmp_path, _req(tmp_path, "[project\n", "pyproject.toml"), "TOML error")
    _refused(tmp_path, _req(tmp_path, '[project]\nname = "x"\ndynamic = ["dependencies"]\n', "pyproject.toml"),
             "never runs", line=3)
    _refused(tmp_path, _req(tmp_path, '[tool.poetry]\nname = "x"\n', "pyproject.toml"), "no [project] table")


def test_an_existing_file_is_not_replaced_without_force(tmp_path):
    src = _req(tmp_path, "torch==2.13.0\n")
    out = tmp_path / "spec.yaml"
    out.write_text("mine\n")
    r = run_envbuilder_in_process("init", str(src), "-o", str(out))
    assert r.code == 2 and "--force" in r.err and out.read_text() == "mine\n"
    assert run_envbuilder_in_process("init", str(src), "-o", str(out), "--force").code == 0
    assert yaml.safe_load(out.read_text())["framework"]["name"] == "pytorch"


def test_hash_options_are_dropped_and_noted(tmp_path):
    src = _req(tmp_path, "torch==2.13.0\nsix==1.16.0 \\\n    --hash=sha256:" + "a" * 64 + "\n")
    r, out = _init(tmp_path, src)
    assert r.code == 0, r.err
    assert yaml.safe_load(out.read_text())["packages"]["pip"] == ["six==1.16.0"]
    assert "--hash dropped" in out.read_text()


# --- ranges in the spec, pinned by the lock's resolver -------------------------------------------

def test_ranges_and_bare_names_pass_check_and_a_local_path_does_not(tmp_path, write_spec):
    base = 'name: r\nframework: {name: pytorch, version: "2.13.0+cpu"}\npython: "3.11"\npackages:\n  pip: '
    assert run_envbuilder_in_process("check", str(write_spec(base + "['numpy>=1.26,<2', scipy]\n"))).code == 0
    r = run_envbuilder_in_process("check", str(write_spec(base + "['-e ./mylib']\n")))
    assert r.code == 2 and "packages.pip[0]" in r.err and "editable" in r.err


def test_the_lock_resolves_a_range_to_one_pinned_version_with_its_hash():
    """lock/pip.py: the same pip resolution as every lock (the image's Python and platform)."""
    from envbuilder.lock import pip as pip_

    groups = pip_.resolve({"packages": ["six>=1.15,<2", "packaging"]}, pip_.target("3.11", "2.36"))
    entries = {e["name"].lower(): e for e in groups["packages"]}
    assert set(entries) == {"six", "packaging"}
    assert entries["six"]["version"].startswith("1.") and len(entries["six"]["sha256"]) == 64
    # what `lock --update NAME` and a re-lock do (lock/resolve.py): every other entry's locked version
    # is preferred while it fits the range; the entry named moves to the newest in its range
    kept = pip_.resolve({"packages": ["six>=1.15,<2"]}, pip_.target("3.11", "2.36"), prefer={"six": "1.15.0"})
    assert kept["packages"][0]["version"] == "1.15.0"
    assert entries["six"]["version"] != "1.15.0"


# --- the way back ---------------------------------------------------------------------------------

def test_export_requirements_from_a_real_lock_and_conda_explicit(tmp_path):
    """hf-text-classification.lock: `envbuilder lock` of the spec `init` wrote from the hf fixture
    (hf-text-classification.yaml, --wheelhouse with torch 2.13.0+cpu), its ranges pinned."""
    from envbuilder.lock.conda import check_lockfile
    from envbuilder.lock.export import conda_explicit
    from envbuilder.lock.model import Lock

    folder = tmp_path / "images" / "hf"
    folder.mkdir(parents=True)
    shutil.copy(DATA / "hf-text-classification.lock", folder / "envbuilder.lock")
    r = run_envbuilder_in_process("export", "requirements", str(folder))
    assert r.code == 0, r.err
    lines = [ln for ln in r.out.splitlines() if not ln.startswith("#")]
    assert len(lines) > 40 and all(" --hash=sha256:" in ln and "==" in ln for ln in lines)
    assert any(ln.startswith("torch==2.13.0+cpu ") for ln in lines) and "--find-links" in r.out
    assert any(ln.startswith("datasets==") for ln in lines)
    out = tmp_path / "req.txt"
    assert run_envbuilder_in_process("export", "requirements", str(folder), "-o", str(out)).code == 0
    assert out.read_text() == r.out
    r = run_envbuilder_in_process("export", "conda", str(folder))
    assert r.code == 2 and "holds no conda package" in r.err
    assert run_envbuilder_in_process("export", "conda", str(tmp_path / "nope")).code == 2

    conda = yaml.safe_load((ROOT / "tests" / "data" / "conda" / "conda-lock.yml").read_text().replace(
        "@CHANNEL@", "/srv/channel"))
    lock = Lock(name="t", inputs={}, conda={"lockfile": check_lockfile(conda, [], "test")})
    lines = conda_explicit(lock, "test").splitlines()
    assert "@EXPLICIT" in lines
    assert "file:///srv/channel/noarch/envbuilder-demo-data-1.0-0.tar.bz2#8c5f26bb1f95bba0e6ba879d5ee9a30c" in lines


def test_the_fixtures_name_their_source():
    for path in DATA.iterdir():
        if path.suffix in (".lock",) or path.name == "hf-text-classification.yaml":
            continue        # envbuilder's own output for that fixture
        head = path.read_text().splitlines()[0]
        assert head.startswith("# Source: https://github.com/"), path
