"""What every command line shares: a parser that says a bad argument in one line, the
usage error found after parsing, and the flags several commands declare (one definition
each). Faces (the CLI, ``heads``, ``bench``) build on it; nothing here runs a model."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

CACHE_DIR_HELP = "model cache (default: $SPECDEC_CACHE or ~/.cache/specdec)"


class Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr, exit code 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


class UsageError(Exception):
    """A bad argument found after parsing (exit 2)."""


def check_writable(folder: Path, what: str, make: bool = False) -> None:
    """Whether a file can be written in ``folder`` (made first with ``make``): a UsageError
    naming ``what`` (the flag and its value) now, rather than lost work at the end."""
    try:
        if make:
            folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise UsageError(f"{what}: cannot write there ({error.strerror})") from None


def add_cache_dir(parser) -> None:
    """``--cache-dir``: where models, runtime forms and heads are cached."""
    parser.add_argument("--cache-dir", help=CACHE_DIR_HELP)


def add_draft_vocab(parser, scope: str = "model drafter: ") -> None:
    """``--draft-vocab``: which tokens a draft model scores (``runtime.draft_vocabulary``)."""
    parser.add_argument(
        "--draft-vocab",
        type=draft_vocab_value,
        default="auto",
        metavar="auto|full|FILE",
        help=f"{scope}the tokens the draft scores (FR-Spec): a file made by 'specdec vocab "
        "build', full (all of them), or auto (default): the vocabulary shipped for a catalog "
        "Qwen2.5 draft when the draft runs on int8 or int4 (a cheaper draft step; measured "
        "faster end to end), else full. The output is exact either way. A file also runs on "
        "bfloat16 and float32; with --draft-runtime auto it puts the draft on the target's "
        "runtime when that is int8 or int4",
    )


def draft_vocab_value(text: str) -> str:
    """auto, full, or a vocabulary file checked before any model loads."""
    from specdec import vocab

    if text in (vocab.AUTO, vocab.FULL):
        return text
    try:
        vocab.read(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def port_value(text: str) -> int:
    """A TCP port, 1..65535 (a larger number would wrap around to another port)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, got {port}")
    return port


def positive_int(text: str) -> int:
    """A count of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def k_value(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {text!r}") from None


def check_choice_k(recipe: str, k: int | str) -> None:
    """A choice of drafters (``model/eagle``) is made from measured rounds: k auto only."""
    if "/" in recipe and k not in ("auto", 0):
        raise UsageError(
            f"--drafter {recipe}: a choice of drafters is made from measured rounds, "
            "as k is: use -k auto"
        )


def drafter_kinds(recipe: str) -> list[str]:
    """'lookup+model' -> ['lookup', 'model']; 'none' -> [] (drafters.recipe's parser);
    'auto' -> ['auto'], resolved once the target is loaded."""
    from specdec.drafters.recipe import parse_recipe

    if recipe == "auto":
        return ["auto"]
    try:
        return parse_recipe(recipe)
    except ValueError as error:
        raise UsageError(f"--{error}") from None
