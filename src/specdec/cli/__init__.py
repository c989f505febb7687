"""``specdec`` command line: thin; parses, builds configs, calls the engine, prints. One
module per command (``generate``, ``serve``, ``tools``), the output in ``output``; the flags
several commands share are ``specdec.arguments``'."""

from __future__ import annotations

import argparse
import sys

from specdec import __version__
from specdec.arguments import Parser, UsageError
from specdec.cli import chat, generate, serve, tools
from specdec.heads import command as heads_command
from specdec.models import ModelError

__all__ = ["UsageError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specdec", description="Exact speculative decoding for LLMs.")
    parser.add_argument("--version", action="version", version=f"specdec {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    generate.add_parser(commands)
    chat.add_parser(commands)
    from specdec.bench import command as bench_command

    bench_command.add_parser(commands)
    heads_command.add_parser(commands, Parser)
    tools.add_measure_parsers(commands)
    serve.add_parser(commands)
    tools.add_file_parsers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (UsageError, ValueError) as error:
        sys.stderr.write(f"specdec: error: {error}\n")
        return 2
    except ModelError as error:
        sys.stderr.write(f"specdec: error: {error}\n")
        return 1
    except OSError as error:  # the machine's: a folder not writable, a full disk, ...
        where = f": {error.filename}" if error.filename else ""
        sys.stderr.write(f"specdec: error: {error.strerror or error}{where}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("specdec: interrupted\n")
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.command == "bench":
        from specdec.bench import command as bench_command

        return bench_command.run(args)
    if args.command == "heads":
        return heads_command.run(args)
    if args.command == "models":
        from specdec.cli.output import print_models

        print_models(args.cache_dir)
        return 0
    runs = {
        "generate": generate.run,
        "chat": chat.run,
        "serve": serve.run,
        "cost": tools.cost,
        "tune": tools.tune,
        "ngram": tools.ngram_build,
        "vocab": tools.vocab_build,
    }
    if args.command == "doctor":
        return tools.doctor(args)
    return runs[args.command](args)
