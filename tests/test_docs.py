"""The commands the README and docs/ show use subcommands and flags the CLI has: a renamed
or removed flag must be deprecated with a message (and the docs changed), never left for a
reader to meet as argparse's 'unrecognized arguments'."""

import argparse
import re
from pathlib import Path

import pytest

from specdec.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# one command: from "specdec SUB" to where a shell or markdown ends it
COMMAND = re.compile(r"(?<![\w/.-])specdec ([a-z]+)([^`|;&#<>()]*)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")  # a prompt: its words are not flags


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def shown_commands(text: str) -> list[tuple[int, str, list[str]]]:
    """(line, subcommand, words after it) of every ``specdec SUB ...`` in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in COMMAND.finditer(QUOTED.sub("''", line)):
            found.append((number, match.group(1), match.group(2).split()))
    return found


def unknown_flags(parser: argparse.ArgumentParser, sub: str, words: list[str]) -> list[str]:
    """The flags in ``words`` that ``specdec SUB`` (or its own subcommand, the first word
    where it has them: ``heads make``) does not declare; every subcommand name unknown."""
    subs = _subparsers(parser)
    if sub not in subs:
        return [sub]
    command = subs[sub]
    nested = _subparsers(command)
    if words and words[0] in nested:
        command = nested[words[0]]
    known = _flags(command)
    return [flag for word in words for flag in FLAG.findall(word) if flag not in known]


def test_the_check_finds_what_it_should():
    parser = build_parser()
    line = 'x `specdec generate "f(x) --no" --drafter lookup --no-such-flag < p` specdec heads make'
    (_, sub, words), (_, nested, rest) = shown_commands(line)
    assert (sub, nested, rest) == ("generate", "heads", ["make"])
    assert unknown_flags(parser, sub, words) == ["--no-such-flag"]
    assert unknown_flags(parser, "heads", ["make", "--kind", "eagle"]) == []
    assert unknown_flags(parser, "heads", ["make", "--no-such-flag"]) == ["--no-such-flag"]
    assert unknown_flags(parser, "generat", []) == ["generat"]


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_every_command_the_docs_show_has_its_flags(page):
    parser = build_parser()
    text = page.read_text()
    subs = _subparsers(parser)
    wrong = [
        f"{page.name}:{number}: specdec {sub}: {', '.join(unknown)}"
        for number, sub, words in shown_commands(text)
        if (sub in subs or words and words[0].startswith("-"))  # prose "specdec runs ..."
        and (unknown := unknown_flags(parser, sub, words))
    ]
    assert not wrong, "\n".join(wrong)
