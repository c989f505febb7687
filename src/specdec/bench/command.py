"""``specdec bench``: argument wiring and the run, kept out of the main CLI module."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from pathlib import Path

from specdec.arguments import add_cache_dir, add_draft_vocab, check_writable
from specdec.bench.harness import (
    WORKLOADS,
    load_workload_file,
    load_workloads,
    run_benchmark,
    runs_to_json,
    summarize,
)
from specdec.bench.report import write_reports
from specdec.bench.systems import (
    DEFAULT_SYSTEMS,
    ModelPool,
    SpecdecSystem,
    describe,
    make_system,
    reference_of,
    systems_help,
)
from specdec.config import VERIFICATIONS, SamplingParams
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import TRANSFORMERS_DTYPES


def add_parser(commands) -> None:
    p = commands.add_parser(
        "bench",
        help="compare specdec with plain decoding and peers, on shipped workloads",
        description=(
            "Run every system on the same prompts, target weights and runtime, interleaved "
            "(A B A B) after a warm-up, and write results.json, results.md, speedup.png and "
            "theory.png. Ratios are against specdec's plain decoding of the same target. "
            "--quick uses tiny random models (seconds; what CI runs)."
        ),
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny random models, 2 prompts per workload, 12 tokens"
    )
    p.add_argument(
        "--target", default=DEFAULT_TARGET, help=f"target model (default: {DEFAULT_TARGET})"
    )
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"draft model (default: {DEFAULT_DRAFT})")
    p.add_argument(
        "--dtype",
        choices=TRANSFORMERS_DTYPES,
        default="int8",
        help="transformers runtime of both models for systems without @RUNTIME, and of "
        "plain, the baseline of every ratio (default: int8)",
    )
    p.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"{systems_help()} (default: {','.join(DEFAULT_SYSTEMS)}, and llamacpp and "
        "model-auto@DTYPE/q4_0 when llama-cpp-python is installed)",
    )
    p.add_argument("--ngram-model", help="n-gram model file for the ngram systems")
    p.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, from {', '.join(WORKLOADS)}",
    )
    p.add_argument(
        "--workload-file",
        help="your own prompts instead of the shipped workloads: JSON lines with 'prompt', "
        "'template' (raw or chat; default raw) and 'id'",
    )
    p.add_argument(
        "--prompts-per-workload", type=int, default=8, help="prompts of each workload (default: 8)"
    )
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per generation (default: 64)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved passes (default: 3)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); e.g. 0.7")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="sampling seed of the first run; each (prompt, pass) adds its index (default: 0)",
    )
    p.add_argument(
        "--verification",
        choices=VERIFICATIONS,
        default="auto",
        help="how specdec verifies sampled drafts (auto: coupled, since bench runs are seeded; "
        "coupled runs must give plain's text). Sampled runs of specdec on the default runtime "
        "are also tested position by position against the target's distribution",
    )
    p.add_argument("--out", help="report folder (default: bench/results/DATE)")
    add_draft_vocab(p, "the draft model of specdec's systems on int8, int4, bfloat16 or float32: ")
    add_cache_dir(p)


def run(args: argparse.Namespace) -> int:
    from specdec.progress import progress_bar

    if args.repeats < 1 or args.prompts_per_workload < 1:
        raise ValueError("--repeats and --prompts-per-workload must be >= 1")
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    if args.systems == ",".join(DEFAULT_SYSTEMS) and not args.quick and _have_llamacpp():
        names += ["llamacpp", f"model-auto@{args.dtype}/q4_0"]  # the bar, and a llama.cpp draft
    ngram = None
    if args.ngram_model:
        from specdec.drafters import NGramModel

        ngram = NGramModel.load(args.ngram_model)
    if "plain" not in names:
        names.insert(0, "plain")  # every ratio is against it
    checker = ModelPool(None, lambda role, runtime, progress: None)  # names checked before loading
    for name in names:
        make_system(name, checker, ngram, args.dtype, args.verification)
    per_workload = 2 if args.quick else args.prompts_per_workload
    max_tokens = 12 if args.quick else args.max_tokens
    if args.workload_file:
        items = load_workload_file(args.workload_file, per_workload)
    else:
        items = load_workloads([w.strip() for w in args.workloads.split(",")], per_workload)
    params = SamplingParams(max_tokens=max_tokens, temperature=args.temperature, seed=args.seed)
    date = datetime.datetime.now().strftime("%Y-%m-%d")
    out_dir = Path(args.out or f"bench/results/{date}")
    check_writable(out_dir, f"--out {out_dir}", make=True)  # before the models load and run
    pool, target_label, draft_vocab = _pool(args)
    systems = {
        name: make_system(name, pool, ngram, args.dtype, args.verification) for name in names
    }
    with progress_bar() as progress:
        pool.progress = progress
        pool.load(set().union(*(system.needs for system in systems.values())))
    descriptions = {name: describe(name, args.dtype) for name in systems}
    references = {name: reference_of(name, names, args.dtype) for name in names}
    total = len(items) * len(systems) * args.repeats
    with progress_bar() as progress:
        done = [0]

        def step(label: str) -> None:  # noqa: ARG001 - one bar for all runs
            done[0] += 1
            progress("benchmark runs", done[0], total)

        runs = run_benchmark(
            systems,
            items,
            pool.tokenizer,
            params,
            args.repeats,
            progress=step,
            references=references,
            sampled_identity=args.verification != "rejection",
        )
    rows = summarize(runs)
    for name, system in systems.items():  # a peer's conversion and load, known once it ran
        if getattr(system, "setup_note", ""):
            descriptions[name] += f" ({system.setup_note})"
    distribution = {}
    if not params.greedy:
        distribution = _distribution_tests(systems, runs, pool, items, params, args.dtype)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "command": "specdec " + " ".join(sys.argv[1:]),
        "target": target_label,
        "dtype": args.dtype,
        "max_tokens": max_tokens,
        "repeats": args.repeats,
        "temperature": args.temperature,
        "prompts": len(items),
        "draft_vocab": draft_vocab,
    }
    try:
        paths = write_reports(out_dir, meta, rows, runs_to_json(runs), descriptions, distribution)
    except OSError as error:  # e.g. the disk filled during the runs: keep them elsewhere
        kept = Path(tempfile.mkdtemp(prefix="specdec-bench-"))
        sys.stderr.write(f"specdec: cannot write the reports to {out_dir} ({error}); ")
        sys.stderr.write(f"writing them to {kept} instead\n")
        paths = write_reports(kept, meta, rows, runs_to_json(runs), descriptions, distribution)
    sys.stdout.write(paths["markdown"].read_text())
    sys.stderr.write(f"reports: {', '.join(str(p) for p in paths.values())}\n")
    return 0


def _distribution_tests(systems, runs, pool, items, params, dtype: str) -> dict:
    """Sampled runs of specdec on the default target runtime, position by position against
    that target (``bench/distribution.py``); other runtimes and peers round differently."""
    from specdec.bench.distribution import check_runs
    from specdec.bench.harness import encode_items

    prompts = encode_items(pool.tokenizer, items)
    backend = pool.backend("target", dtype)
    return {
        name: check_runs(backend, prompts, [r for r in runs if r.system == name], params)
        for name, system in systems.items()
        if isinstance(system, SpecdecSystem) and system.runtime.target == dtype
    }


def _have_llamacpp() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def _pool(args: argparse.Namespace) -> tuple[ModelPool, str, str]:
    """Loaders for every (role, runtime) the systems need; each runs once, on first need. The
    pool, the target's label and what the draft scores (``--draft-vocab``, as resolved)."""
    if args.quick:
        from specdec.bench.tiny import char_tokenizer, perturbed_copy, tiny_llama

        def load_tiny(role: str, dtype: str, progress):  # noqa: ARG001 - built in a blink
            from specdec.backends.quant.convert import make_int8_batch_invariant

            target = tiny_llama(seed=0, max_positions=4096)
            model = target if role == "target" else perturbed_copy(target, noise=0.03, seed=1)
            if dtype == "int8":
                return make_int8_batch_invariant(model)
            if dtype == "int4":
                from specdec.backends.quant.convert import make_int4_batch_invariant

                return make_int4_batch_invariant(model)
            return model.to(torch_dtype(dtype))

        quick = "tiny random Llama (quick mode)"
        return ModelPool(char_tokenizer(), load_tiny), quick, "full"
    from specdec.loading import load_backend, load_tokenizer
    from specdec.runtime import parse_runtime, score_draft_vocabulary

    specs = {"target": args.target, "draft": args.draft}

    def load_hf(role: str, dtype: str, progress):  # a draft as generate loads it
        runtime = parse_runtime(dtype)
        backend = runtime.load(specs[role], args.cache_dir, progress, draft=role == "draft")
        if role == "draft":
            score_draft_vocabulary(backend, specs[role], args.draft_vocab, dtype)
        return backend.model

    def load_gguf(role: str, gguf_type: str, progress):
        return load_backend(
            specs[role],
            cache_dir=args.cache_dir,
            progress=progress,
            runtime="llamacpp",
            gguf_type=gguf_type,
        )

    def gguf_file(role: str):
        from specdec.models import CATALOG, cache_root, ensure_gguf, lookup

        if specs[role] not in CATALOG:
            raise ValueError(f"{specs[role]!r} is not a catalog model: no GGUF file to read")
        return ensure_gguf(lookup(specs[role]), cache_root(args.cache_dir))

    def openvino_dir(role: str):
        from specdec.bench.openvino import exported_dir
        from specdec.models import cache_root

        return exported_dir(cache_root(args.cache_dir), specs[role])

    def onnx_dir(role: str):
        from specdec.bench.onnxgenai import converted_dir, pair_dir
        from specdec.models import CATALOG, cache_root, ensure_converted, lookup

        root = cache_root(args.cache_dir)
        converted = {}
        for each in ("target", "draft") if role == "pair" else ("target",):
            if specs[each] not in CATALOG:
                raise ValueError(f"{specs[each]!r} is not a catalog model: nothing to convert")
            entry = lookup(specs[each])
            hf_dir = ensure_converted(entry, root, verify=True)
            converted[each] = converted_dir(root, entry.name, hf_dir)
        if role == "target":
            return converted["target"]
        notes = "; ".join(f"{each} {note}" for each, (_, note) in converted.items())
        return pair_dir(root, converted["target"][0], converted["draft"][0]), notes

    tokenizer = load_tokenizer(args.target, args.cache_dir)
    pool = ModelPool(
        tokenizer,
        load_hf,
        load_gguf,
        gguf_file,
        openvino_dir,
        args.cache_dir,
        args.target,
        onnx_dir=onnx_dir,
    )
    return pool, args.target, _vocab_label(args.draft_vocab, args.draft)


def _vocab_label(vocabulary: str, draft: str) -> str:
    """``--draft-vocab`` in words for the report: auto says which file it takes where."""
    from specdec.runtime import SAME_TEXT_AS_PLAIN, draft_vocabulary

    if vocabulary != "auto":
        return vocabulary
    shipped = draft_vocabulary(draft, vocabulary, SAME_TEXT_AS_PLAIN[0])
    if shipped is None:
        return "auto (full: no vocabulary ships for this draft)"
    return f"auto ({Path(shipped).name} on {' and '.join(SAME_TEXT_AS_PLAIN)}, else full)"


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def machine() -> str:
    """The CPU (its name, family/model and widest vector set, AMX where it has it: the two
    EPYC kinds share a name), cores, OS, Python, torch, and any kernels held to a smaller
    instruction set."""
    import torch

    from specdec.backends.runtime_choice import ISA_VARIABLES
    from specdec.machine import cpu_flags, cpu_kind, cpu_name

    flags = cpu_flags()
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
    if "amx_int8" in flags:
        widest += ", AMX"
    kind = ", ".join(part for part in (cpu_kind(), widest) if part)
    cpu = f"{cpu_name()} ({kind})" if kind else cpu_name()
    held = [f"{name}={os.environ[name]}" for name in ISA_VARIABLES if os.environ.get(name)]
    described = (
        f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)"
    )
    return f"{described}; kernels held: {' '.join(held)}" if held else described
