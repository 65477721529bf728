"""Helpers shared by the renderers."""

from __future__ import annotations

from .. import __version__
from ..quoting import docker_comment, shell_word

CA_SECRET = "/run/secrets/ca"
NETRC_SECRET = "/run/secrets/netrc"   # a private index's login (--netrc): pip reads $NETRC
WHEELHOUSE = "/wheelhouse"
PIP_INDEX_CONF = ".envbuilder-pip.conf"   # the site's pip index (config pip_index_url), beside the wheels


def header(comment: str, title: str, spec_sha: str, extra: list[str]) -> list[str]:
    title = docker_comment(title, "name")
    lines = [f"{comment} {title}",
             f"{comment} Written by envbuilder {__version__} from a spec with sha256 {spec_sha[:16]}.",
             f"{comment} Generated file: change the spec and run `envbuilder build` instead of editing it."]
    lines += [f"{comment} {e}" if e else comment for e in extra]
    return lines


def shell_join(commands: list[str], indent: str = "    ") -> str:
    """Commands chained with && over continuation lines."""
    return (" \\\n" + indent + "&& ").join(commands)


def export_line(env: dict[str, str]) -> str:
    """export K='v' ... for a step's build flags (only while that step runs)."""
    return "export " + " ".join(f"{k}={shell_word(v, k)}" for k, v in env.items())


def network_setup() -> list[str]:
    """Prefix of every step that downloads: local wheels first, the site's CA bundle and a
    private index's login (netrc) if given; both are BuildKit secrets, in no layer. The site's pip
    index (config.py pip_index_url, extra_index_url: the ones the lock resolved against) comes as a
    pip configuration file in the bound wheelhouse, so it too stays out of every layer."""
    return [f"export PIP_FIND_LINKS={WHEELHOUSE}",
            f"if [ -s {WHEELHOUSE}/{PIP_INDEX_CONF} ]; then export PIP_CONFIG_FILE={WHEELHOUSE}/{PIP_INDEX_CONF}; fi",
            f"if [ -s {CA_SECRET} ]; then export PIP_CERT={CA_SECRET} CURL_CA_BUNDLE={CA_SECRET}; fi",
            f"if [ -s {NETRC_SECRET} ]; then export NETRC={NETRC_SECRET}; fi"]
