"""``specdec heads data|train|eval|make|list``: argument wiring, kept out of the main CLI."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdec.arguments import add_cache_dir, add_draft_vocab
from specdec.heads.data import CORPUS_SUFFIXES, REPLY_TEMPERATURE
from specdec.heads.evaluate import POSITIONS_PER_CHUNK
from specdec.heads.make import REPLY_TOKENS
from specdec.heads.nets import KINDS
from specdec.heads.train import INITS, PRECISIONS
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import runtime_value


def add_parser(commands, parser_class) -> None:
    heads = commands.add_parser(
        "heads",
        help="Medusa / EAGLE draft heads trained on this CPU from the target itself",
        description="Draft heads read the target's own last hidden state, so a draft costs "
        "a few percent of a target step. Train them once per target: 'heads data' runs the "
        "target over local text, 'heads train' fits the heads within a time budget, "
        "'heads eval' measures them; then generate/serve/bench with --drafter medusa or "
        "--drafter eagle.",
    )
    sub = heads.add_subparsers(dest="heads_command", required=True, parser_class=parser_class)

    data = sub.add_parser(
        "data",
        help="run the target over local text and store its features (resumable)",
        description="Run the target in prefill mode over fixed-length chunks of local text "
        "(or let it write replies to prompts, keeping the features of the passes that wrote "
        "them) and store each chunk's tokens and final-norm features (float16) under the "
        "heads cache. Interrupt and rerun to continue. Default corpus: this Python's standard "
        "library (source that every machine has).",
    )
    data.add_argument(
        "--corpus",
        nargs="+",
        help="files or directories of text like what you will generate (default: the "
        "Python standard library)",
    )
    data.add_argument(
        "--suffix",
        nargs="+",
        default=CORPUS_SUFFIXES,
        help="file suffixes to read under corpus directories (default: "
        f"{' '.join(CORPUS_SUFFIXES)})",
    )
    data.add_argument(
        "--minutes",
        type=float,
        default=30.0,
        help="time budget (default: 30 minutes; measured on 2 cores: the 1.5B on int4 ran "
        "218k tokens of the standard library in 17 minutes; a 512-token chunk takes 2.1-2.4 s "
        "on int4, 2.2-3.4 s on int8: bench/heads_data_chunk.py)",
    )
    data.add_argument(
        "--chat-prompts",
        metavar="FILE",
        help="instead of a corpus: prompts (a .jsonl file with a 'prompt' field a line, or "
        "one prompt a line) that the target answers through its chat template, sampled at "
        "temperature 0.7; prompt + reply are collected as chat-like data (kept beside the "
        "corpus's in the same data directory; replies saved, so a rerun continues)",
    )
    data.add_argument(
        "--chat",
        action="store_true",
        help="instead of a corpus: the target answers the built-in prompts (about 1,200 "
        "requests of common kinds over everyday, science, writing and programming topics; "
        "none on the chat benchmark's topics), collected like --chat-prompts (measured on 2 "
        "cores: 24 minutes wrote 483 replies, 78k tokens of data, with the int8 1.5B on an "
        "AVX2 EPYC; 20 minutes wrote 654 replies on an AVX-512 EPYC with int4, when each "
        "reply still ran through the target twice)",
    )
    data.add_argument(
        "--code",
        action="store_true",
        help="instead of a corpus: the target completes the documented functions of the "
        "corpus (default: the standard library), each given as its signature and docstring "
        "in raw code as a code prompt is, so the heads learn the bodies the target itself "
        "writes; replies sampled and saved as --chat's (measured on 2 cores: 18 minutes "
        "wrote 200 chunks, 102k tokens, with the int4 1.5B on a Zen 4 EPYC)",
    )
    data.add_argument(
        "--batch",
        type=int,
        default=32,
        help="--chat/--chat-prompts/--code: replies written together, one target pass for a token "
        "of each (int8/int4 runtimes; each reply as the target writes it alone; default 32)",
    )
    data.add_argument(
        "--reply-tokens",
        type=int,
        default=256,
        help="--chat/--chat-prompts/--code: tokens of each reply at most (default: 256)",
    )
    data.add_argument(
        "--reply-temperature",
        type=float,
        default=REPLY_TEMPERATURE,
        help="--chat/--chat-prompts/--code: the temperature the target's replies are sampled at "
        f"(default: {REPLY_TEMPERATURE}; 0: its greedy replies). A data directory holds "
        "replies of one temperature: give another --data for another",
    )
    data.add_argument("--max-tokens", type=int, help="stop after this many tokens")
    data.add_argument("--length", type=int, default=512, help="tokens per chunk (default: 512)")
    _common(data)

    train = sub.add_parser(
        "train",
        help="train Medusa or EAGLE heads on collected data (resumable)",
        description="Fit the heads to the target's own next-token distributions "
        "(self-distillation) on the data of 'heads data', within --minutes; a rerun continues "
        "from the last checkpoint. The heads are cached per target and refused for any other.",
    )
    train.add_argument("--kind", choices=KINDS, required=True, help="which heads to train")
    train.add_argument(
        "--minutes",
        type=float,
        default=25.0,
        help="time budget, reading the data included (default: 25 minutes; a step that "
        "would end past it is not begun; a rerun adds to a checkpoint's)",
    )
    train.add_argument(
        "--vocab-size",
        type=int,
        help="the heads score the N most frequent tokens of the data (FR-Spec; default: 32768 "
        "where training runs in bfloat16, 16384 in float32, where the output layer is most "
        "of a step)",
    )
    train.add_argument(
        "--num-heads", type=int, help="Medusa: heads, i.e. the longest draft (default: 4)"
    )
    train.add_argument(
        "--intermediate-size", type=int, help="EAGLE: width of its layer's MLP (default: 4096)"
    )
    train.add_argument(
        "--distill-weight",
        type=float,
        default=0.1,
        help="EAGLE: weight of the distillation loss next to the feature regression "
        "(default: 0.1, EAGLE-1's)",
    )
    train.add_argument(
        "--distill-every",
        type=int,
        help="EAGLE: the distillation term on every Nth position only (a random offset each "
        "step; the regression on all): only those pay for the output layer, most of a "
        "float32 step (measured on an AVX2 EPYC, 16,384 rows: 2.5 s a step, 2.2 s "
        "with 2, 1.5 s with 4: bench/heads_train_step.py; default: 1 where training runs "
        "in bfloat16, 4 in float32)",
    )
    train.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="matrix products in training: bfloat16 where the CPU multiplies it natively "
        "(AVX-512 BF16, AMX), else float32 (default: auto)",
    )
    train.add_argument(
        "--unroll",
        type=int,
        default=1,
        help="EAGLE: drafting steps rehearsed per position, each on the layer's own previous "
        "prediction (EAGLE-3's training-time test; default: 1, EAGLE-1's single step)",
    )
    train.add_argument(
        "--learning-rate",
        type=float,
        help="AdamW's peak learning rate, reached after a short warmup and decayed linearly "
        "to a tenth over the budget (default: 5e-4 for EAGLE, 1e-3 for Medusa)",
    )
    train.add_argument(
        "--init",
        choices=INITS,
        help="EAGLE: where its layer starts when training starts (not when it continues): "
        "target = the target's last decoder layer (attention, norms, its strongest MLP "
        "channels) and final norm, random = transformers' random weights (default: target; "
        'docs/notes/heads.md, "Starting from the target\'s last layer")',
    )
    train.add_argument("--restart", action="store_true", help="discard a checkpoint, start over")
    _common(train)

    evaluate = sub.add_parser(
        "eval",
        help="agreement with the target on held-out and unseen text, predicted speedup",
        description="On the held-out chunks, and on the target's greedy replies to 12 "
        "prompts no drafter trained on (written once, kept in the data directory): "
        "per-position top-1 agreement of greedy chain drafts with the target, the "
        "acceptance it implies, the draft's measured cost per token against a target step "
        "(c), and the speedup the paper's formula predicts. --drafter auto compares the "
        "prediction on the unseen prompts.",
    )
    evaluate.add_argument(
        "--kind",
        choices=[*KINDS, "model"],
        required=True,
        help="heads to evaluate; model: the draft model (--draft) measured the same way, "
        "so that --drafter auto can choose between them",
    )
    evaluate.add_argument(
        "--draft",
        default=DEFAULT_DRAFT,
        help=f"draft model for --kind model (default: {DEFAULT_DRAFT})",
    )
    evaluate.add_argument(
        "--draft-runtime",
        type=runtime_value,
        default="auto",
        metavar="RUNTIME",
        help="--kind model: the draft's runtime, as for 'specdec generate' (int8, bfloat16, "
        "float32, llamacpp:TYPE, transformers = --dtype, llamacpp = Q4_0; default: auto). "
        "Only the default configuration informs --drafter auto; others are recorded under "
        "their own name for comparison",
    )
    add_draft_vocab(evaluate, "--kind model: ")
    evaluate.add_argument("--max-k", type=int, default=4, help="chain length to score (4)")
    evaluate.add_argument(
        "--positions",
        type=int,
        default=POSITIONS_PER_CHUNK,
        help="positions drafted from in each held-out chunk, at random (default: "
        f"{POSITIONS_PER_CHUNK}; more positions narrow the estimate: the first draft's "
        "acceptance has a standard error of at most 0.5 / sqrt(chunks x positions))",
    )
    _common(evaluate)

    making = sub.add_parser(
        "make",
        help="data, training and evaluation of one kind of heads within one time budget",
        description="Make heads from nothing in one command: code data (the corpus), chat "
        "data (the target's own replies), training and, for EAGLE, a last stretch at "
        "distillation weight 1.0, within --minutes of data and training; then 'heads eval' "
        "(for the default target, of the draft model too, so that --drafter auto compares "
        "them). "
        "The phases are the 'heads data' / 'heads train' commands each one prints, run with "
        "the target loaded once; the budget is shared as in the recipes measured within 90 "
        "minutes on 2 cores (EAGLE: 20% code data, 25% chat data, 40% + 15% training; a "
        "phase that ends early leaves its time to the later ones). Interrupt and rerun to "
        "continue; a make whose budget ran out continues with a larger --minutes.",
    )
    making.add_argument(
        "--kind", choices=KINDS, default="eagle", help="which heads to make (default: eagle)"
    )
    making.add_argument(
        "--minutes",
        type=float,
        default=90.0,
        help="budget of data and training, the evaluation not counted (default: 90; on an "
        "AVX-512 EPYC, 2 cores, the default make took 90.1 minutes and its EAGLE ran 2.29x "
        "plain int8 on code and 1.95x on chat; on an AVX2 EPYC 90.1 minutes, and its EAGLE "
        "with lookup in front ran 2.34x on code and 2.27x on chat: docs/notes/heads.md)",
    )
    making.add_argument(
        "--corpus",
        nargs="+",
        help="files or directories read as the code data (default: the target completes "
        "the documented functions of the Python standard library, as 'heads data --code')",
    )
    making.add_argument(
        "--suffix",
        nargs="+",
        help=f"file suffixes to read under corpus directories ({' '.join(CORPUS_SUFFIXES)})",
    )
    making.add_argument(
        "--chat-prompts",
        metavar="FILE",
        help="the chat data answers these prompts (as 'heads data --chat-prompts') instead of "
        "the built-in ones",
    )
    making.add_argument(
        "--no-chat",
        action="store_true",
        help="no chat data: the code data alone (heads for code; its share goes to the others)",
    )
    making.add_argument(
        "--reply-tokens",
        type=int,
        default=REPLY_TOKENS,
        help=f"tokens of each chat reply at most (default: {REPLY_TOKENS}, the recipes')",
    )
    making.add_argument(
        "--length", type=int, help="tokens per chunk of data (default: 512, as for 'heads data')"
    )
    making.add_argument(
        "--restart",
        action="store_true",
        help="make the heads again from the start of the plan (data already collected stays "
        "in the data directory and is added to; the heads are trained afresh)",
    )
    _common(making)

    listing = sub.add_parser("list", help="heads trained for each target in the cache")
    add_cache_dir(listing)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"catalog name or transformers model directory (default: {DEFAULT_TARGET})",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "int8", "int4", "float32", "bfloat16"],
        help="the target runtime the heads will draft for (default: auto, the one 'specdec "
        "generate' runs the target on here: int8 or int4, whichever verifies faster; heads "
        "load for either int runtime, the features differing only by rounding)",
    )
    p.add_argument(
        "--data",
        help="data directory (default: the target's entry in the heads cache)",
    )
    add_cache_dir(p)


def run(args: argparse.Namespace) -> int:
    if args.heads_command == "list":
        return _list(args)
    check_args(args)  # before the target loads (seconds): a bad value costs one line
    from specdec.allocator import keep_freed_memory
    from specdec.heads import store
    from specdec.heads.fingerprint import target_fingerprint
    from specdec.loading import load_backend
    from specdec.progress import progress_bar

    with progress_bar() as progress:
        if args.dtype == "auto":
            from specdec.runtime import choose_target_runtime

            args.dtype = choose_target_runtime("auto", args.target, args.cache_dir, progress)
        target = load_backend(args.target, args.dtype, args.cache_dir, progress)
        fingerprint = target_fingerprint(target.model)
        entry = store.entry_dir(args.cache_dir, fingerprint, args.target)
        data_dir = Path(args.data).expanduser() if args.data else entry / "data"
        # after the load (a first run's conversion frees its own large blocks as it goes):
        # training's tensors of 100+ MB would be faulted in afresh each time otherwise
        keep_freed_memory()
        return _run_loaded(args, target, fingerprint, data_dir, entry, progress)


def phase_parser() -> argparse.ArgumentParser:
    """A parser of ``heads ...`` command lines, as ``specdec`` parses them: what ``heads make``
    runs its phases through."""
    parser = argparse.ArgumentParser(prog="specdec")
    commands = parser.add_subparsers(dest="command", required=True)
    add_parser(commands, argparse.ArgumentParser)
    return parser


def check_args(args: argparse.Namespace) -> None:
    """A subcommand's own arguments, checked before its target loads."""
    from specdec.heads import evaluate, train

    {
        "data": check_data_args,
        "train": train.check_args,
        "eval": evaluate.check_args,
        "make": check_make_args,
    }[args.heads_command](args)


def _run_loaded(args, target, fingerprint: str, data_dir: Path, entry: Path, progress) -> int:
    """A subcommand, its arguments checked, on a loaded target (``make`` runs its phases
    through here)."""
    from specdec.heads import evaluate, train

    if args.heads_command == "data":
        return _data(args, target, fingerprint, data_dir, progress)
    if args.heads_command == "make":
        return _make(args, target, fingerprint, data_dir, entry, progress)
    if args.heads_command == "train":
        return train.run_command(args, target, fingerprint, data_dir, entry, progress)
    return evaluate.run_command(args, target, fingerprint, data_dir, entry, progress)


def check_data_args(args: argparse.Namespace) -> None:
    """``specdec heads data``'s own arguments (checked before the target loads)."""
    if args.length < 16:
        raise ValueError(f"--length must be >= 16, got {args.length}")
    if args.minutes <= 0:
        raise ValueError(f"--minutes must be > 0, got {args.minutes}")
    corpus_alone = args.corpus and not args.code  # --code completes the corpus's functions
    if sum(map(bool, (args.chat_prompts, corpus_alone, args.chat, args.code))) > 1:
        raise ValueError(
            "give one of --corpus, --chat, --chat-prompts, --code (--code reads the functions "
            "of --corpus; run again to add another source)"
        )
    if args.reply_tokens < 1:
        raise ValueError(f"--reply-tokens must be >= 1, got {args.reply_tokens}")
    if args.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    if not args.reply_temperature >= 0:
        raise ValueError(f"--reply-temperature must be >= 0, got {args.reply_temperature}")


def check_make_args(args: argparse.Namespace) -> None:
    """``specdec heads make``'s own arguments (checked before the target loads)."""
    if args.minutes <= 0:
        raise ValueError(f"--minutes must be > 0, got {args.minutes}")
    if args.no_chat and args.chat_prompts:
        raise ValueError("give --no-chat or --chat-prompts, not both")
    if args.reply_tokens < 1:
        raise ValueError(f"--reply-tokens must be >= 1, got {args.reply_tokens}")
    if args.length is not None and args.length < 16:
        raise ValueError(f"--length must be >= 16, got {args.length}")
    if args.corpus:  # the check 'heads data' makes (paths that exist, files to read)
        from specdec.heads import data

        data.corpus_files(args.corpus, args.suffix or data.CORPUS_SUFFIXES)
    if args.chat_prompts and not Path(args.chat_prompts).expanduser().is_file():
        raise ValueError(f"{args.chat_prompts}: no such file")


def _make(args, target, fingerprint, data_dir, entry, progress) -> int:
    """``specdec heads make``: its phases run as the commands they print. A termination
    (``timeout 60m specdec heads make``, a killed job) stops it as an interrupt does, so the
    minutes the phase ran are kept and a rerun gives it only the rest of its share."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # handlers: main only
        return _make_phases(args, target, fingerprint, data_dir, entry, progress)

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return _make_phases(args, target, fingerprint, data_dir, entry, progress)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _make_phases(args, target, fingerprint, data_dir, entry, progress) -> int:
    import shlex
    import time

    from specdec.heads import make

    plan = make.phases(
        args.kind,
        args.corpus,
        args.suffix,
        not args.no_chat,
        args.chat_prompts,
        args.reply_tokens,
        args.length,
        compare=args.target == DEFAULT_TARGET,  # the default draft pairs with it
    )
    data_dir.mkdir(parents=True, exist_ok=True)
    path = make.progress_path(data_dir, args.kind)
    done = None if args.restart else make.Progress.load(path, args.kind)
    if done is None and path.exists() and not args.restart:
        sys.stderr.write(f"{path}: unreadable progress, the make starts over\n")
    state = done or make.Progress(args.kind)
    if done is not None:
        sys.stderr.write(
            f"continuing a make of {args.kind} heads ({path}): "
            f"{', '.join(done.done) or 'no phase'} done, "
            f"{state.spent_in_budget(plan):.1f} of {args.minutes:g} minutes spent "
            "(--restart to start over)\n"
        )
    if all(p.name in state.done for p in plan):
        sys.stderr.write(f"{args.kind} heads are made (--restart to make them again)\n")
        return 0
    # the phases' own options, shown as given (the target when not the default)
    shown = [] if args.target == DEFAULT_TARGET else ["--target", args.target]
    shown += ["--dtype", args.dtype]  # as resolved: the runtime the data and heads are for
    shown += ["--data", args.data] if args.data else []
    shown += ["--cache-dir", args.cache_dir] if args.cache_dir else []
    parser = phase_parser()
    for number, phase in enumerate(plan, 1):
        if phase.name in state.done:
            continue
        argv = list(phase.argv)
        if phase.share > 0:
            minutes = make.minutes_for(plan, state, args.minutes, phase.name)
            if minutes < 0.01 and state.spent_in_budget(plan) < args.minutes - 0.01:
                # interrupted at the end of its share, with time left for the later phases
                sys.stderr.write(f"{make.LABELS[phase.name]}: its share is spent\n")
                state.done.append(phase.name)
                state.save(path)
                continue
            if minutes < 0.01:
                raise ValueError(
                    f"the budget of {args.minutes:g} minutes is spent "
                    f"({state.spent_in_budget(plan):.1f}) before the {make.LABELS[phase.name]}: "
                    "run again with more --minutes, which continues"
                )
            argv += ["--minutes", f"{minutes:.2f}"]
        if phase.name == "train" and phase.name not in state.spent:
            argv.append("--restart")  # a make's first training starts from nothing
        sys.stderr.write(
            f"[{number}/{len(plan)}] {make.LABELS[phase.name]}: "
            f"specdec heads {shlex.join([*argv, *shown])}\n"
        )
        phase_args = parser.parse_args(["heads", *argv, *shown])
        check_args(phase_args)
        began = time.monotonic()
        try:
            _run_loaded(phase_args, target, fingerprint, data_dir, entry, progress)
            state.done.append(phase.name)
        finally:  # an interrupted or failed phase keeps the minutes it ran
            spent = state.spent.get(phase.name, 0.0) + (time.monotonic() - began) / 60.0
            state.spent[phase.name] = round(spent, 3)
            state.save(path)
    parts = ", ".join(
        f"{make.LABELS[p.name]} {state.spent.get(p.name, 0.0):.1f} min" for p in plan if p.share > 0
    )
    evaluated = sum(state.spent.get(p.name, 0.0) for p in plan if p.share == 0)
    sys.stderr.write(
        f"made {args.kind} heads: {state.spent_in_budget(plan):.1f} minutes of data and "
        f"training ({parts}), evaluated in {evaluated:.1f} min more; "
        "'specdec heads list' shows them, --drafter auto uses them where predicted faster\n"
    )
    return 0


def _data(args, target, fingerprint, data_dir, progress) -> int:
    from specdec.heads import data

    files: list[Path] = []
    documents = None
    source = "corpus"
    if args.chat_prompts or args.chat or args.code:
        from specdec.heads.chat_prompts import builtin_prompts
        from specdec.heads.code_prompts import builtin_code_prompts

        if args.code:
            corpus = data.corpus_files(args.corpus or [data.default_corpus()], args.suffix)
            prompts, source, template = builtin_code_prompts(corpus), "code", "raw"
            if not prompts:
                raise ValueError(
                    "--code: no public function with a docstring and a body in the corpus's "
                    f"{len(corpus)} files (it completes Python functions)"
                )
        elif args.chat_prompts:
            prompts, source, template = data.read_prompts(Path(args.chat_prompts)), "chat", "chat"
        else:
            prompts, source, template = builtin_prompts(), "chat-builtin", "chat"
        data_dir.mkdir(parents=True, exist_ok=True)
        saved = data_dir / data.SAVED_REPLIES[source]
        documents = data.replies(
            target,
            prompts,
            args.reply_tokens,
            saved,
            batch=args.batch,
            temperature=args.reply_temperature,
            template=template,
        )
        what = f"{len(prompts)} prompts and the target's replies"
    else:
        files = data.corpus_files(args.corpus or [data.default_corpus()], args.suffix)
        what = f"{len(files)} files"
    manifest = data.collect(
        target,
        files,
        data_dir,
        fingerprint,
        args.length,
        args.max_tokens,
        args.minutes,
        progress,
        source=source,
        documents=documents,
    )
    by_source: dict[str, int] = {}
    for shard in manifest["shards"]:
        source = shard.get("source", "corpus")
        by_source[source] = by_source.get(source, 0) + shard["chunks"]
    chunks = sum(by_source.values())
    sources = ", ".join(f"{count} {source}" for source, count in sorted(by_source.items()))
    sys.stderr.write(
        f"{data_dir}: {chunks} chunks of {manifest['length']} tokens ({sources}; "
        f"{chunks * manifest['length']} tokens, {manifest['seconds'] / 60:.1f} min of target "
        f"time in all); this run read {what}, the target on {args.dtype}\n"
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    from specdec.heads import store

    rows = store.list_entries(args.cache_dir)
    if not rows:
        sys.stdout.write("no heads trained yet (see 'specdec heads --help')\n")
    for row in rows:
        sys.stdout.write(row + "\n")
    return 0
