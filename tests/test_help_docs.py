"""`envbuilder --help` and every command's --help end with the page that explains it
(envbuilder/helpdocs.py); each page named exists, and so does each README section named."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from conftest import ROOT
from envbuilder.cli import COMMANDS, main
from envbuilder.helpdocs import DOCS

LINK = re.compile(r"([\w./-]+\.md)(?:#([\w-]+))?")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)      # `# comments` in code blocks are no headings
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def help_text(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return out.getvalue()


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_ends_with_a_page_that_exists(command):
    text = help_text(*([command] if command else []))
    tail = " ".join(text.split("Docs:")[-1].split())
    assert "Docs:" in text and tail == DOCS[command], text
    links = LINK.findall(tail)
    assert links, tail
    for page, section in links:
        path = ROOT / page
        assert path.is_file(), f"`envbuilder {command} --help` names {page}, which does not exist"
        if section:
            assert section in anchors(path), f"{page} has no section #{section} (headings: {sorted(anchors(path))})"


def test_every_command_has_a_page():
    assert set(DOCS) == {"", *COMMANDS}


def test_the_stand_alone_verify_entry_names_the_same_page(capsys):
    from envbuilder.verify.cli import main as verify_main

    with pytest.raises(SystemExit):
        verify_main(["--help"])
    assert " ".join(capsys.readouterr().out.split()).endswith(DOCS["verify"])
