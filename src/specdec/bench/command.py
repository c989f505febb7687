"""``specdec bench``: argument wiring and the run, kept out of the main CLI module."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

from specdec.bench.harness import WORKLOADS, load_workloads, run_benchmark, runs_to_json, summarize
from specdec.bench.report import write_reports
from specdec.bench.systems import DEFAULT_SYSTEMS, LlamaCppSystem, Models, describe, make_system
from specdec.config import SamplingParams
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET


def add_parser(commands) -> None:
    p = commands.add_parser(
        "bench", help="compare specdec with plain decoding and peers, on shipped workloads",
        description=(
            "Run every system on the same prompts, target weights and runtime, interleaved "
            "(A B A B) after a warm-up, and write results.json, results.md, speedup.png and "
            "theory.png. Ratios are against specdec's plain decoding of the same target. "
            "--quick uses tiny random models (seconds; what CI runs)."
        ),
    )
    p.add_argument("--quick", action="store_true", help="tiny random models, 2 prompts per workload, 12 tokens")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"target model (default: {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"draft model (default: {DEFAULT_DRAFT})")
    p.add_argument("--dtype", choices=["int8", "bfloat16", "float32"], default="int8",
                   help="runtime of both models, for every system (default: int8)")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help="comma-separated: plain, hf-generate, hf-assisted, hf-lookup, llamacpp, and "
                        "DRAFTER-kN or DRAFTER-auto with DRAFTER one of model, lookup, ngram, "
                        f"lookup+model, lookup+ngram (default: {','.join(DEFAULT_SYSTEMS)}; llamacpp "
                        "joins when llama-cpp-python is installed)")
    p.add_argument("--ngram-model", help="n-gram model file for the ngram systems")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from {', '.join(WORKLOADS)}")
    p.add_argument("--prompts-per-workload", type=int, default=8, help="prompts of each workload (default: 8)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per generation (default: 64)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved passes (default: 3)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); e.g. 0.7")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    p.add_argument("--out", help="report folder (default: bench/results/DATE)")
    p.add_argument("--cache-dir", help="model cache (default: $SPECDEC_CACHE or ~/.cache/specdec)")


def run(args: argparse.Namespace) -> int:
    from specdec.cli_output import progress_bar

    if args.repeats < 1 or args.prompts_per_workload < 1:
        raise ValueError("--repeats and --prompts-per-workload must be >= 1")
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    ngram = None
    if args.ngram_model:
        from specdec.drafters import NGramModel

        ngram = NGramModel.load(args.ngram_model)
    for name in names:
        if name != "llamacpp":
            describe_or_fail(name, ngram)
    if "plain" not in names:
        names.insert(0, "plain")  # every ratio is against it
    per_workload = 2 if args.quick else args.prompts_per_workload
    max_tokens = 12 if args.quick else args.max_tokens
    items = load_workloads([w.strip() for w in args.workloads.split(",")], per_workload)
    params = SamplingParams(max_tokens=max_tokens, temperature=args.temperature, seed=args.seed)
    with progress_bar() as progress:
        models, target_label = _models(args, progress)
    systems = {name: make_system(name, models, ngram) for name in names if name != "llamacpp"}
    descriptions = {name: describe(name) for name in systems}
    _add_llamacpp(args, names, systems, descriptions)
    total = len(items) * len(systems) * args.repeats
    with progress_bar() as progress:
        done = [0]

        def step(label: str) -> None:  # noqa: ARG001 - one bar for all runs
            done[0] += 1
            progress("benchmark runs", done[0], total)

        runs = run_benchmark(systems, items, models.tokenizer, params, args.repeats, progress=step)
    rows = summarize(runs)
    date = datetime.datetime.now().strftime("%Y-%m-%d")
    out_dir = Path(args.out or f"bench/results/{date}")
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(),
            "command": "specdec " + " ".join(sys.argv[1:]),
            "target": target_label, "dtype": args.dtype, "max_tokens": max_tokens,
            "repeats": args.repeats, "temperature": args.temperature, "prompts": len(items)}
    paths = write_reports(out_dir, meta, rows, runs_to_json(runs), descriptions)
    sys.stdout.write(paths["markdown"].read_text())
    sys.stderr.write(f"reports: {', '.join(str(p) for p in paths.values())}\n")
    return 0


def describe_or_fail(name: str, ngram) -> None:
    """Validate a system name before any model is loaded."""
    make_system(name, Models(None, None, None), ngram)


def _models(args: argparse.Namespace, progress) -> tuple[Models, str]:
    if args.quick:
        from specdec.backends.int8 import make_int8_batch_invariant
        from specdec.bench.tiny import char_tokenizer, perturbed_copy, tiny_llama

        target = tiny_llama(seed=0, max_positions=4096)
        draft = perturbed_copy(target, noise=0.03, seed=1)
        if args.dtype == "int8":
            target, draft = make_int8_batch_invariant(target), make_int8_batch_invariant(draft)
        return Models(target, draft, char_tokenizer()), "tiny random Llama (quick mode)"
    from specdec.loading import load_backend

    target = load_backend(args.target, args.dtype, args.cache_dir, progress)
    draft = load_backend(args.draft, args.dtype, args.cache_dir, progress)
    return Models(target.model, draft.model, target.tokenizer), args.target


def _add_llamacpp(args, names, systems, descriptions) -> None:
    wanted = "llamacpp" in names
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        if wanted:
            sys.stderr.write("llamacpp skipped: llama-cpp-python is not installed\n")
        return
    from specdec.models import CATALOG, cache_root, ensure_gguf

    if args.quick or args.target not in CATALOG:
        return
    gguf = ensure_gguf(CATALOG[args.target], cache_root(args.cache_dir))
    systems["llamacpp"] = LlamaCppSystem("llamacpp", str(gguf))
    descriptions["llamacpp"] = "llama.cpp, the target's own GGUF (Q4_K_M), 2 threads"


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads)")
