"""The smaller commands: ``tune`` and ``cost`` (measured costs and speedups), ``ngram build``
and ``vocab build`` (drafter files from text), ``models`` (the catalog), ``doctor`` (this
machine's verdicts)."""

from __future__ import annotations

import argparse
import statistics
import sys

from specdec.arguments import Parser, UsageError, add_cache_dir, add_draft_vocab, check_writable
from specdec.config import SamplingParams
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET, GGUF_TYPES
from specdec.prompting import encode_prompt, read_prompt_file
from specdec.runtime import HELP as RUNTIME_HELP
from specdec.runtime import (
    TRANSFORMERS_DTYPES,
    draft_vocabulary,
    load_draft,
    parse_runtime,
    runtime_value,
    score_draft_vocabulary,
)


def add_measure_parsers(commands) -> None:
    """``tune`` and ``cost``."""
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
    add_draft_vocab(tune, "")
    add_cache_dir(tune)
    cost = commands.add_parser(
        "cost",
        help="print a model's verify-cost curve v(n) = time(n-token pass) / time(1-token step)",
        description="Speculation pays only if scoring k+1 tokens at once costs little more "
        "than one step. This measures the median time of an n-token forward pass after a "
        "context of --context tokens, for n = 1..--max-n, on the chosen runtime. Attention "
        "grows with the context, so v(n) does too.",
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
        "--context",
        type=int,
        default=32,
        help="tokens already in the cache before each pass (default: 32)",
    )
    cost.add_argument(
        "--repeats", type=int, default=5, help="timings per block size, median kept (default: 5)"
    )
    add_cache_dir(cost)


def add_file_parsers(commands) -> None:
    """``ngram``, ``vocab``, ``models`` and ``doctor``."""
    ngram = commands.add_parser("ngram", help="n-gram drafter models")
    ngram_commands = ngram.add_subparsers(dest="ngram_command", required=True, parser_class=Parser)
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
    add_cache_dir(build)
    vocab = commands.add_parser("vocab", help="trimmed draft vocabularies")
    vocab_commands = vocab.add_subparsers(dest="vocab_command", required=True, parser_class=Parser)
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
    add_cache_dir(vocab_build)
    models = commands.add_parser(
        "models", help="list the embedded model catalog and its cache status"
    )
    add_cache_dir(models)
    doctor_parser = commands.add_parser(
        "doctor",
        help="this machine's CPU and software, and whether int8 block passes equal their steps",
        description="Prints the CPU, its SIMD features, the software versions and optional "
        "extras, then checks the int8 and int4 runtimes' promise on this machine: a random "
        "model at the default target's layer sizes scores blocks of 2..45 tokens bit for bit "
        "as one-token steps, at 1, 2, 3, 4, 8 threads and this machine's count (seconds). "
        "Exit code 1 if any block differs.",
    )
    doctor_parser.add_argument(
        "--floor",
        action="store_true",
        help="also measure this machine's memory read speed and time the default pair's "
        "one-token steps on int4 and int8 against it: bytes read a step, the floor those "
        "bytes set, the step's multiple of it; the draft also as it drafts, scoring the "
        "shipped vocabulary (loads the pair; their runtime forms are made on first use, "
        "minutes)",
    )
    add_cache_dir(doctor_parser)


def doctor(args: argparse.Namespace | None = None) -> int:
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

    choices = cached_choices(cache_root(args.cache_dir if args is not None else None))
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
            detail = ""
            if kernels.best_path() == kernels.AMX:
                detail = " (passes of 32+ rows; smaller ones on AVX-512 VNNI)"
            out.write(f"int4 runtime: kernel built, {path} path{detail}\n")
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
    if args is not None and args.floor:
        memory_floor(args.cache_dir)
    return 1 if failed else 0


FLOOR_STEPS = 40  # steps timed a model for --floor


def memory_floor(
    cache_dir: str | None,
    models: tuple[str, ...] | None = None,
    drafts: tuple[str, ...] | None = None,
) -> None:
    """This machine's read speed, and ``models``' steps (the default pair's) on int4 and int8
    against it; those of ``drafts`` (the default draft) also as generate drafts with them,
    scoring the shipped vocabulary (``--draft-vocab auto``)."""
    from specdec import floor
    from specdec.backends.hf import HFModel
    from specdec.backends.runtime_choice import step_times_ms
    from specdec.loading import load_backend
    from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET, ModelError
    from specdec.progress import progress_bar

    bandwidth = floor.read_bandwidth()
    out = sys.stdout
    out.write(f"memory: reads {bandwidth / 1e9:.1f} GB/s (a sum over 1 GiB, the fastest of 5)\n")

    def measure(label: str, backend) -> None:
        # A shared machine's slow spells lengthen some steps: the median and the fastest of
        # 40 (the bandwidth is the fastest of its reads).
        times = step_times_ms(backend, repeats=FLOOR_STEPS)
        measured = floor.Floor(
            floor.step_bytes(backend.model), statistics.median(times), bandwidth, min(times)
        )
        out.write(f"  {label}: {measured.line()}\n")
        out.flush()

    drafts = (DEFAULT_DRAFT,) if drafts is None else drafts
    for name in models or (DEFAULT_DRAFT, DEFAULT_TARGET):
        for runtime in ("int4", "int8"):
            try:
                with progress_bar() as progress:
                    backend = load_backend(name, runtime, cache_dir, progress)
            except ModelError as error:  # the int4 kernel that does not build here, ...
                out.write(f"  {name} on {runtime}: not measured: {error}\n")
                continue
            measure(f"{name} on {runtime}", backend)
            del backend
            if name in drafts and draft_vocabulary(name, "auto", runtime):
                with progress_bar() as progress:  # its own form on int4 (a scale per 128)
                    draft, _ = load_draft(name, runtime, cache_dir, progress)
                assert isinstance(draft, HFModel), "int4 and int8 drafts are transformers models"
                backend = draft
                tokens = len(backend.model.get_output_embeddings().token_ids)
                measure(f"{name} on {runtime} as a draft ({tokens:,} tokens scored)", backend)
                del backend


def cost(args: argparse.Namespace) -> int:
    from specdec.progress import progress_bar
    from specdec.tune import time_pass

    if not 1 <= args.max_n <= 64 or args.repeats < 1 or args.context < 1:
        raise UsageError("--max-n must be in 1..64, --repeats >= 1 and --context >= 1")
    runtime = parse_runtime(args.runtime, args.dtype, args.gguf_type)
    with progress_bar() as progress:
        model = runtime.load(args.model, args.cache_dir, progress)
    if model.max_length is not None and args.context + args.max_n > model.max_length:
        raise UsageError(
            f"--context {args.context} and --max-n {args.max_n} do not fit in the model's "
            f"{model.max_length} positions"
        )
    # Ordinary token ids (inside any vocabulary): a context to attend to.
    context = [i % model.vocab_size for i in range(1000, 1000 + args.context)]
    step = time_pass(model, context, 1, args.repeats)
    label = runtime.name
    sys.stdout.write(
        f"{args.model} on {label} after {args.context} tokens: 1-token step "
        f"{step * 1e3:.1f} ms\n n   ms     v(n)\n"
    )
    for n in range(1, args.max_n + 1):
        seconds = step if n == 1 else time_pass(model, context, n, args.repeats)
        sys.stdout.write(f"{n:2d} {seconds * 1e3:7.1f} {seconds / step:6.2f}\n")
    return 0


def tune(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specdec.cli.output import print_tune
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
        draft = runtimes[1].load(args.draft, args.cache_dir, progress, draft=True)
        score_draft_vocabulary(draft, args.draft, args.draft_vocab, runtimes[1].name)
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


def _corpus_tokenizer(args: argparse.Namespace):
    """The files (checked; -o checked writable) and the tokenizer and logits width of
    --tokenizer."""
    from pathlib import Path

    from transformers import AutoConfig, AutoTokenizer

    from specdec.models import CATALOG, cache_root, ensure_converted, lookup

    missing = [f for f in args.files if not Path(f).is_file()]
    if missing:
        raise UsageError(f"not a file: {missing[0]}")
    check_writable(Path(args.output).parent, f"-o {args.output}")  # before the counting
    source = args.tokenizer
    if source in CATALOG:
        source = ensure_converted(lookup(source), cache_root(args.cache_dir))
    tokenizer = AutoTokenizer.from_pretrained(source)
    try:
        vocab_size = AutoConfig.from_pretrained(source).vocab_size  # the logits width
    except (OSError, ValueError):
        vocab_size = len(tokenizer)
    return [Path(f) for f in args.files], tokenizer, vocab_size


def vocab_build(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specdec import vocab

    if args.size < 1:
        raise UsageError(f"--size must be >= 1, got {args.size}")
    files, tokenizer, vocab_size = _corpus_tokenizer(args)
    counts = vocab.count_tokens((f.read_text(errors="replace") for f in files), tokenizer)
    # Every special token (end of text, the chat markers, fill-in-the-middle...): an answer
    # may need one that the corpus never holds.
    added = getattr(tokenizer, "added_tokens_decoder", {})
    special = {int(t) for t in getattr(tokenizer, "all_special_ids", [])}
    special |= {int(t) for t, token in added.items() if getattr(token, "special", False)}
    token_ids = vocab.top_tokens(counts, args.size, (t for t in special if 0 <= t < vocab_size))
    total = sum(counts.values())
    covered = sum(counts[t] for t in token_ids)
    meta = {"files": len(files), "corpus_tokens": total, "coverage": covered / max(1, total)}
    vocab.save(Path(args.output), token_ids, str(args.tokenizer), vocab_size, meta)
    sys.stderr.write(
        f"saved {args.output}: {len(token_ids)} of {vocab_size} tokens cover "
        f"{100 * meta['coverage']:.2f}% of {total} corpus tokens\n"
    )
    return 0


def ngram_build(args: argparse.Namespace) -> int:
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
