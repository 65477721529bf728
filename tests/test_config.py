"""envbuilder's configuration (envbuilder/config.py, docs/config.md): real files in real folders,
real environment variables, the real command line. Precedence: command line > ENVBUILDER_<KEY> >
the user's config.toml > the site's (/etc/envbuilder/config.toml or ENVBUILDER_CONFIG) > default.
Every bad file is one message naming the file, the line, the key and the fix, exit 2."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from conftest import RECIPES, ROOT, no_config, run_envbuilder
from envbuilder.config import KEYS, SITE_FILE, doc_table, load_config
from envbuilder.errors import EnvbuilderError


def _files(tmp_path: Path, site: str = "", user: str | None = None) -> dict:
    """An environment with a site file (ENVBUILDER_CONFIG) and, when given, a user file (XDG)."""
    (tmp_path / "site").mkdir(parents=True, exist_ok=True)
    (tmp_path / "site" / "config.toml").write_text(site)
    env = {"ENVBUILDER_CONFIG": str(tmp_path / "site" / "config.toml"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
           "HOME": str(tmp_path / "home")}
    if user is not None:
        (tmp_path / "xdg" / "envbuilder").mkdir(parents=True, exist_ok=True)
        (tmp_path / "xdg" / "envbuilder" / "config.toml").write_text(user)
    return env


def test_precedence_command_line_environment_user_site_default(tmp_path):
    site_file = tmp_path / "site" / "config.toml"
    user_file = tmp_path / "xdg" / "envbuilder" / "config.toml"
    env = _files(tmp_path,
                 site='# the site\nwheelhouse = "/site/wheels"\nca_bundle = "/site/ca.pem"\nnetrc = "/site/netrc"\n'
                      'runtime = "charliecloud"\nregistry_mirror = "http://127.0.0.1:5000/"\n',
                 user='ca_bundle = "/user/ca.pem"\nnetrc = "/user/netrc"\nsite = "example-gpu"\n')
    env["ENVBUILDER_NETRC"] = "/env/netrc"
    env["ENVBUILDER_WHEELHOUSE"] = "/env/wheels"
    cfg = load_config({"wheelhouse": "/cli/wheels", "ca_bundle": None}, env)
    assert (cfg.get("wheelhouse"), cfg.origin("wheelhouse")) == ("/cli/wheels", "command line --wheelhouse")
    assert (cfg.get("netrc"), cfg.origin("netrc")) == ("/env/netrc", "environment ENVBUILDER_NETRC")
    assert (cfg.get("ca_bundle"), cfg.origin("ca_bundle")) == ("/user/ca.pem", f"user config {user_file}:1")
    assert (cfg.get("site"), cfg.origin("site")) == ("example-gpu", f"user config {user_file}:3")
    assert (cfg.get("runtime"), cfg.origin("runtime")) == ("charliecloud", f"site config {site_file}:5")
    # a mirror is recorded without its trailing slash, as dockerd's registry-mirrors
    assert cfg.get("registry_mirror") == "http://127.0.0.1:5000"
    assert (cfg.get("pip_index_url"), cfg.origin("pip_index_url")) == ("https://pypi.org/simple", "default")
    assert (cfg.get("conda_channel"), cfg.origin("conda_channel")) == (None, "default")
    assert [k for k, _, _ in cfg.items()] == list(KEYS)
    assert [(f.kind, f.read) for f in cfg.files] == [("site", True), ("user", True)]


def test_relative_paths_in_a_file_are_relative_to_its_folder(tmp_path):
    env = _files(tmp_path, site='wheelhouse = "wheels"\nca_bundle = "../certs/ca.pem"\n')
    cfg = load_config(None, {**env, "ENVBUILDER_NETRC": "rel/netrc"})
    assert cfg.get("wheelhouse") == str(tmp_path / "site" / "wheels")
    assert cfg.get("ca_bundle") == str(tmp_path / "site" / "../certs/ca.pem")
    assert cfg.get("netrc") == "rel/netrc"          # a variable: the working folder's, as on the command line


def test_lists_and_the_default_user_file_under_home(tmp_path):
    env = _files(tmp_path, site='extra_index_url = ["https://a.example/simple", "https://b.example/simple"]\n'
                                'conda_channel = ["https://conda.example/forge", "file:///srv/channel"]\n')
    del env["XDG_CONFIG_HOME"]
    (tmp_path / "home" / ".config" / "envbuilder").mkdir(parents=True)
    (tmp_path / "home" / ".config" / "envbuilder" / "config.toml").write_text('pip_index_url = "https://m.example/simple"\n')
    cfg = load_config(None, env)
    assert cfg.list("extra_index_url") == ["https://a.example/simple", "https://b.example/simple"]
    assert cfg.list("conda_channel") == ["https://conda.example/forge", "file:///srv/channel"]
    assert cfg.origin("pip_index_url") == f"user config {tmp_path}/home/.config/envbuilder/config.toml:1"


BAD_FILES = [
    # (file text, line, what the message says, what the fix says)
    ('wheelhouse = /opt/wheels\n', 1, "wheelhouse: not valid TOML: Invalid value", 'key = "value"'),
    ('# ok\nca_bundle = "/x"\nca_bundle = "/y"\n', 3, "ca_bundle: not valid TOML", 'key = "value"'),
    ('[[broken\n', 1, "site config: not valid TOML", 'key = "value"'),
    ('\n\nwheelhose = "/opt/wheels"\n', 3, "wheelhose: not a configuration key", "did you mean wheelhouse?"),
    ('pip_index = "https://m.example/simple"\n', 1, "pip_index: not a configuration key", "did you mean pip_index_url?"),
    ('frobnicate = 1\n', 1, "frobnicate: not a configuration key", "known keys: wheelhouse, ca_bundle"),
    ('wheelhouse = 3\n', 1, "wheelhouse: is a number; it must be a string", 'wheelhouse = "/opt/wheels"'),
    ('ca_bundle = true\n', 1, "ca_bundle: is a boolean; it must be a string", "ca_bundle = "),
    ('extra_index_url = [1, 2]\n', 1, "extra_index_url: is a list; it must be a string or a list of strings",
     "extra_index_url = ["),
    ('x = 1\n[wheelhouse]\npath = "/w"\n', 1, "x: not a configuration key", "known keys"),
    ('[wheelhouse]\npath = "/w"\n', 1, "wheelhouse: is a table; it must be a string", 'wheelhouse = "/opt/wheels"'),
    ('registry_mirror = "ftp://mirror.example"\n', 1, "is not an http:// or https:// URL", "registry_mirror = "),
    ('registry_mirror = "https://mirror.example/v2/library"\n', 1, "has a path", "scheme, host, port"),
    ('registry_mirror = "https://bob:pw@mirror.example"\n', 1, "holds a login", "scheme, host, port"),
    ('registry_mirror = "http://127.0.0.1:port"\n', 1, "port that is not a number", "scheme, host, port"),
    ('pip_index_url = "pypi.example/simple"\n', 1, "is not an http(s):// URL", 'pip_index_url = "https://'),
    ('runtime = "apptainr"\n', 1, "'apptainr' is not a runtime", "did you mean apptainer?"),
    ('site = ""\n', 1, "site: is empty", "leave the key out"),
]


@pytest.mark.parametrize("text,line,reason,fix", BAD_FILES, ids=[b[2][:30] for b in BAD_FILES])
def test_a_bad_site_file_is_one_message_with_file_line_key_and_fix(tmp_path, text, line, reason, fix):
    env = _files(tmp_path, site=text)
    r = run_envbuilder("config", env=env)
    site = tmp_path / "site" / "config.toml"
    assert r.code == 2 and "Traceback" not in r.err and r.out == "", r.err
    assert r.err.startswith(f"error: {site}:{line}: "), r.err
    assert reason in r.err and fix in r.err.split("\n  fix: ", 1)[1], r.err
    assert "secret" not in r.err and "pw@" not in r.err
    as_json = run_envbuilder("config", "--json", env=env)
    data = json.loads(as_json.out)
    assert as_json.code == 2 and data["ok"] is False and data["line"] == line and data["source"] == str(site)


def test_the_users_file_and_the_variables_are_named_too(tmp_path):
    user = tmp_path / "xdg" / "envbuilder" / "config.toml"
    r = run_envbuilder("config", env=_files(tmp_path, user='\nwheelhouse = "/w"\nregistry-mirror = "http://m"\n'))
    assert r.code == 2 and r.err.startswith(f"error: {user}:3: registry-mirror: not a configuration key"), r.err
    assert "did you mean registry_mirror?" in r.err
    r = run_envbuilder("config", env={**_files(tmp_path / "b"), "ENVBUILDER_REGISTRY_MIRROR": "mirror.example:5000"})
    assert r.code == 2 and "ENVBUILDER_REGISTRY_MIRROR: 'mirror.example:5000' is not an http:// or https:// URL " \
        "(set in environment ENVBUILDER_REGISTRY_MIRROR)" in r.err, r.err
    r = run_envbuilder("config", env={**_files(tmp_path / "b"), "ENVBUILDER_RUNTIME": "charlecloud"})
    assert r.code == 2 and "ENVBUILDER_RUNTIME: 'charlecloud' is not a runtime" in r.err
    assert "did you mean charliecloud?" in r.err


def test_a_config_path_that_is_not_a_toml_file(tmp_path):
    env = {**_files(tmp_path), "ENVBUILDER_CONFIG": str(tmp_path / "nowhere.toml")}
    r = run_envbuilder("config", env=env)
    assert r.code == 2 and f"{tmp_path}/nowhere.toml is not a file (named by ENVBUILDER_CONFIG)" in r.err
    assert "fix: point ENVBUILDER_CONFIG at a TOML file, or unset it" in r.err and "Traceback" not in r.err
    (tmp_path / "bin.toml").write_bytes(b"wheelhouse = \"\xff\xfe\"\n")
    r = run_envbuilder("config", env={**env, "ENVBUILDER_CONFIG": str(tmp_path / "bin.toml")})
    assert r.code == 2 and "not UTF-8 text" in r.err and "Traceback" not in r.err


def test_envbuilder_config_prints_each_key_value_origin_and_the_files(tmp_path):
    env = _files(tmp_path, site='wheelhouse = "/opt/wheels"\n\nregistry_mirror = "http://127.0.0.1:5000"\n')
    env["ENVBUILDER_CA_BUNDLE"] = "/etc/ssl/certs/ca-certificates.crt"
    r = run_envbuilder("config", env=env)
    assert r.code == 0, r.err
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in r.out.splitlines()[:len(KEYS)]}
    site = tmp_path / "site" / "config.toml"
    assert rows["wheelhouse"] == ["/opt/wheels", f"site config {site}:1"]
    assert rows["registry_mirror"] == ["http://127.0.0.1:5000", f"site config {site}:3"]
    assert rows["ca_bundle"] == ["/etc/ssl/certs/ca-certificates.crt", "environment ENVBUILDER_CA_BUNDLE"]
    assert rows["netrc"] == ["-", "default"] and rows["pip_index_url"] == ["https://pypi.org/simple", "default"]
    assert f"site {site} (read, named by ENVBUILDER_CONFIG)" in r.out
    assert f"user {tmp_path}/xdg/envbuilder/config.toml (not present)" in r.out
    data = json.loads(run_envbuilder("config", "--json", env=env).out)
    assert data["ok"] is True and [k["key"] for k in data["keys"]] == list(KEYS)
    by_key = {k["key"]: k for k in data["keys"]}
    assert by_key["wheelhouse"]["origin"] == f"site config {site}:1" and by_key["wheelhouse"]["env"] == "ENVBUILDER_WHEELHOUSE"
    assert data["files"][0] == {"kind": "site", "path": str(site), "read": True, "chosen_by": "ENVBUILDER_CONFIG"}


def test_this_machines_site_file_is_read_when_nothing_else_is_named(tmp_path):
    if not SITE_FILE.is_file():
        pytest.skip(f"{SITE_FILE} is not there (the set-up writes it: .ci/mirror-bases.sh)")
    r = run_envbuilder("config", "--json", env={"ENVBUILDER_CONFIG": "", "XDG_CONFIG_HOME": str(tmp_path)})
    data = json.loads(r.out)
    assert r.code == 0 and data["files"][0]["path"] == str(SITE_FILE) and data["files"][0]["read"]
    by_key = {k["key"]: k for k in data["keys"]}
    for key in ("wheelhouse", "ca_bundle", "registry_mirror"):
        if by_key[key]["value"] is not None:
            assert by_key[key]["origin"].startswith(f"site config {SITE_FILE}:")


# --- where the values are used ------------------------------------------------------------------

def test_a_configured_path_that_is_missing_names_the_key_and_where_it_was_set(tmp_path):
    env = _files(tmp_path, site='\nwheelhouse = "gone"\n')
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "o"), "--no-build",
                       env=env)
    site = tmp_path / "site" / "config.toml"
    assert r.code == 2 and "Traceback" not in r.err
    assert f"wheelhouse: no such folder: {tmp_path}/site/gone (set in site config {site}:2)" in r.err, r.err
    assert "fix: give a folder that holds .whl files, or change or remove it there" in r.err
    assert not (tmp_path / "o").exists()
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "o"), "--no-build",
                       env={**env, "ENVBUILDER_CA_BUNDLE": str(tmp_path / "no.pem")})
    assert r.code == 2 and f"ca_bundle: no such file: {tmp_path}/no.pem (set in environment ENVBUILDER_CA_BUNDLE)" in r.err
    assert "or unset ENVBUILDER_CA_BUNDLE" in r.err
    # the command line wins, and is named as before
    r = run_envbuilder("build", str(RECIPES / "cpu-torch-horovod.yaml"), "--out", str(tmp_path / "o"), "--no-build",
                       "--wheelhouse", str(tmp_path / "nowhere"), env=env)
    assert r.code == 2 and "--wheelhouse: no such folder" in r.err and "set in" not in r.err


def test_build_and_lock_options_come_from_the_configuration(tmp_path, monkeypatch):
    from envbuilder.lockcmd import build_options

    (tmp_path / "wheels").mkdir()
    (tmp_path / "ca.pem").write_text("x")
    env = _files(tmp_path, site='wheelhouse = "../wheels"\nca_bundle = "../ca.pem"\n'
                                'pip_index_url = "https://mirror.example/simple"\n'
                                'extra_index_url = "https://download.pytorch.org/whl/cpu"\n')
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    opts = build_options(Namespace(wheelhouse=None, ca_bundle=None, netrc=None))
    assert opts.wheelhouse == str(tmp_path / "site/../wheels") and opts.ca_bundle == str(tmp_path / "site/../ca.pem")
    assert opts.index_url == "https://mirror.example/simple"
    assert opts.extra_index_urls == ("https://download.pytorch.org/whl/cpu",)
    assert opts.wheelhouse_origin.startswith("site config ")
    given = build_options(Namespace(wheelhouse=str(tmp_path), ca_bundle=None, netrc=None))
    assert given.wheelhouse == str(tmp_path) and given.wheelhouse_origin == "command line --wheelhouse"


def test_the_lock_resolves_against_the_configured_index(tmp_path):
    """The lock's pip run gets the configured index: a mirror that does not answer fails the lock's
    pip step naming the index, not PyPI."""
    from envbuilder.errors import CheckFailed
    from envbuilder.lock import pip as pip_

    with pytest.raises(CheckFailed) as e:
        pip_.resolve({"packages": ["six==1.16.0"]}, pip_.target("3.11", "2.36"),
                     index_url="http://127.0.0.1:9/simple")
    assert "127.0.0.1:9" in str(e.value) or "could not resolve" in str(e.value)


def test_default_site_and_runtime_come_from_the_configuration(tmp_path):
    spec = RECIPES / "cpu-torch-horovod.yaml"
    env = _files(tmp_path, site='runtime = "charliecloud"\n')
    r = run_envbuilder("build", str(spec), "--out", str(tmp_path / "a"), "--no-build", env=env)
    assert r.code == 0, r.err
    assert "(charliecloud runtime)" in (tmp_path / "a" / "job.sbatch").read_text()
    r = run_envbuilder("build", str(spec), "--out", str(tmp_path / "b"), "--no-build", "--runtime", "host", env=env)
    assert r.code == 0 and "(host runtime)" in (tmp_path / "b" / "job.sbatch").read_text()
    r = run_envbuilder("check", str(spec), env={**env, "ENVBUILDER_SITE": "no-such-site"})
    assert r.code == 2 and "no-such-site" in r.err and "Traceback" not in r.err


def test_conda_channel_from_a_file_is_checked_naming_the_file(tmp_path, monkeypatch):
    from envbuilder.lock.conda import channels

    env = _files(tmp_path, site='conda_channel = "https://conda.example/forge, file:///srv/ch"\n')
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("ENVBUILDER_CONDA_CHANNEL", raising=False)
    assert channels(["conda-forge"]) == ["https://conda.example/forge", "file:///srv/ch"]
    (tmp_path / "site" / "config.toml").write_text('conda_channel = "$(id)"\n')
    with pytest.raises(EnvbuilderError) as e:
        channels([])
    assert "conda_channel (site config" in e.value.message() and "is not a conda channel" in e.value.message()


def test_builds_that_must_not_see_this_machines_config_can_say_so(tmp_path):
    cfg = load_config(None, no_config(tmp_path))
    assert all(origin == "default" for _, _, origin in cfg.items())


def test_docs_config_holds_the_key_table():
    page = (ROOT / "docs" / "config.md").read_text()
    assert doc_table() in page, "docs/config.md: paste the output of `python -c 'from envbuilder.config import " \
        "doc_table; print(doc_table())'`"


def test_the_builds_pip_gets_the_configured_index_beside_the_wheels(tmp_path):
    """Docker and buildah builds: the index the lock resolved against reaches the build's pip as a
    pip configuration file in the bound wheelhouse (network_setup reads it), in no layer; PyPI alone
    writes none, so a default build is unchanged. Real pip reads the file."""
    import subprocess
    import sys

    from envbuilder.engines.context import pip_index_conf, stage_context
    from envbuilder.render.common import PIP_INDEX_CONF, WHEELHOUSE, network_setup

    assert pip_index_conf("https://pypi.org/simple") is None and pip_index_conf(None) is None
    text = pip_index_conf("https://mirror.example/simple", ("https://download.pytorch.org/whl/cpu",))
    ctx = stage_context(tmp_path, {"Dockerfile": b"FROM x\n"}, None, text)
    conf = ctx / "wheelhouse" / PIP_INDEX_CONF
    shown = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                           env={"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}).stdout
    assert "global.index-url='https://mirror.example/simple'" in shown, shown
    assert "global.extra-index-url='https://download.pytorch.org/whl/cpu'" in shown, shown
    assert f"export PIP_CONFIG_FILE={WHEELHOUSE}/{PIP_INDEX_CONF}" in " ".join(network_setup())
    assert not (stage_context(tmp_path, {}, None, None) / "wheelhouse" / PIP_INDEX_CONF).exists()


def test_a_configured_wheelhouse_stays_out_of_a_rendered_folder(tmp_path):
    """`build --no-build` fills the folder's wheelhouse/ only for --wheelhouse on that command; the
    site's wheelhouse is the build's, not every rendered folder's (the README's "empty wheelhouse/")."""
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "six-1.16.0-py2.py3-none-any.whl").write_bytes(b"PK")
    env = _files(tmp_path, site=f'wheelhouse = "{tmp_path}/wheels"\n')
    spec = str(RECIPES / "cpu-torch-horovod.yaml")
    r = run_envbuilder("build", spec, "--out", str(tmp_path / "a"), "--no-build", env=env)
    assert r.code == 0, r.err
    assert sorted(p.name for p in (tmp_path / "a" / "wheelhouse").iterdir()) == ["README.md"]
    r = run_envbuilder("build", spec, "--out", str(tmp_path / "b"), "--no-build", "--wheelhouse",
                       str(tmp_path / "wheels"), env=env)
    assert r.code == 0 and (tmp_path / "b" / "wheelhouse" / "six-1.16.0-py2.py3-none-any.whl").is_file()


def test_wheels_that_would_beat_the_locked_file_stay_out_of_the_build(tmp_path):
    """PEP 440 lets `torch==2.13.0` match the wheelhouse's `2.13.0+cpu`: a build whose lock pins
    PyPI's torch must not see that wheel (pip would take it, then fail the lock's hash)."""
    from envbuilder.engines.context import conflicting_wheels, stage_context

    wh = tmp_path / "wheels"
    wh.mkdir()
    for name in ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "six-1.16.0-py2.py3-none-any.whl",
                 "Other_Pkg-1.0-py3-none-any.whl"):
        (wh / name).write_bytes(b"PK")
    locked = [{"name": "torch", "version": "2.13.0", "file": "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"},
              {"name": "six", "version": "1.16.0", "file": "six-1.16.0-py2.py3-none-any.whl"}]
    skip = conflicting_wheels(wh, locked)
    assert skip == ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",)
    ctx = stage_context(tmp_path, {}, str(wh), None, skip)
    assert sorted(p.name for p in (ctx / "wheelhouse").iterdir()) == ["Other_Pkg-1.0-py3-none-any.whl",
                                                                     "six-1.16.0-py2.py3-none-any.whl"]
    # the CPU preset's lock pins the wheelhouse's own file: nothing is left out
    assert conflicting_wheels(wh, [dict(locked[0], file="torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")]) == ()

