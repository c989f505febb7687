"""``specdec`` command line: thin; builds configs, calls the engine, prints."""

from __future__ import annotations

import argparse
import sys

from specdec.config import SamplingParams, SpecConfig


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr, exit code 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


class UsageError(Exception):
    """A bad argument found after parsing (exit 2)."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specdec", description="Exact speculative decoding for LLMs.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    generate = commands.add_parser(
        "generate",
        help="generate text with speculative decoding",
        description=(
            "Generate a completion of PROMPT. A draft model proposes k tokens per round, the "
            "target verifies them in one pass; the output is exactly the target's (same "
            "tokens when greedy, same distribution when sampling)."
        ),
    )
    _add_generate_arguments(generate)
    return parser


def _add_generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--target", required=True, help="target model: a local transformers model directory")
    p.add_argument("--draft", help="draft model directory (needed with --drafter model)")
    p.add_argument("--drafter", choices=["model", "none"], default="model",
                   help="who drafts: a small model, or none for plain decoding (default: model)")
    p.add_argument("-k", type=int, default=4, help="drafted tokens per round (default: 4; 0 = plain)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature; 0 = greedy (default: 0)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default: 128)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the request (default: 0)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="weights dtype; only float32 guarantees token-identical greedy output")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="print one JSON object: text, token_ids, finish_reason, stats")
    out.add_argument("--show-drafts", action="store_true",
                     help="colour tokens: accepted drafts green, rejected drafts red, "
                          "target-sampled (recovered/bonus) blue")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
    except (UsageError, ValueError) as error:
        sys.stderr.write(f"specdec: error: {error}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("specdec: interrupted\n")
        return 130
    return 0


def _generate(args: argparse.Namespace) -> int:
    from specdec.cli_output import print_json, stream_to_terminal

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, stop=tuple(args.stop),
    )
    spec = SpecConfig(k=args.k)
    if args.drafter == "model" and args.k > 0 and not args.draft:
        raise UsageError("--drafter model needs --draft DIR (or use --drafter none)")
    engine = _build_engine(args)
    tokenizer = engine.target.tokenizer
    if tokenizer is None:
        raise UsageError(f"{args.target} has no tokenizer saved beside it")
    prompt_ids = tokenizer.encode(args.prompt)
    if args.json:
        print_json(engine.generate(prompt_ids, params, spec))
    else:
        stream_to_terminal(engine, prompt_ids, params, spec, show_drafts=args.show_drafts)
    return 0


def _build_engine(args: argparse.Namespace):
    from specdec.drafters import ModelDrafter
    from specdec.engine import Engine
    from specdec.loading import load_hf

    target = load_hf(args.target, args.dtype)
    if args.drafter == "none" or args.k == 0:
        return Engine(target)
    return Engine(target, ModelDrafter(load_hf(args.draft, args.dtype)))


if __name__ == "__main__":
    sys.exit(main())
