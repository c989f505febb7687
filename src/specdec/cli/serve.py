"""``specdec serve``: the OpenAI-compatible server, in one process or as Ray Serve replicas."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys

from specdec.arguments import (
    UsageError,
    add_cache_dir,
    add_draft_vocab,
    check_choice_k,
    k_value,
    port_value,
)
from specdec.config import (
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_ROWS,
    DEFAULT_PREFILL_ROWS,
    DEFAULT_PREFIX_CACHE_MB,
)
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.runtime import HELP as RUNTIME_HELP
from specdec.runtime import TRANSFORMERS_DTYPES, runtime_value


def add_parser(commands) -> None:
    serve = commands.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server with speculative decoding",
        description="Serve /v1/completions and /v1/chat/completions (streaming or not), "
        "/v1/models, /health, Prometheus /metrics, and vLLM's /tokenize, /detokenize and "
        "/tokenizer_info. "
        "One worker thread decodes up to --max-active requests, each with its own KV caches; "
        "--max-queue more may wait, beyond that the answer is 503. On int8 and int4 (the "
        "default: chosen as generate chooses) every step is one round of every active "
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
    add_draft_vocab(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=port_value, default=8000, help="port (default: 8000)")
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
        "--prefill-rows",
        type=int,
        default=DEFAULT_PREFILL_ROWS,
        help="prompt tokens a batched step prefills into each model for a request joining "
        "it: a longer prompt is fed in parts between the other requests' steps, so their "
        f"streams go on (0: every joining prompt whole at once; default: {DEFAULT_PREFILL_ROWS})",
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
        "--prefix-cache-mb",
        type=int,
        default=DEFAULT_PREFIX_CACHE_MB,
        help="batched runtime: memory (MB, each model) kept for the caches of requests that "
        "ended, so that a prompt beginning like one of them (a conversation's next turn) "
        f"copies that part; the oldest go first (0: only live requests'; default: "
        f"{DEFAULT_PREFIX_CACHE_MB})",
    )
    serve.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        help=f"requests that may wait (default: {DEFAULT_MAX_QUEUE}; a waiting request holds "
        "no KV cache)",
    )
    add_cache_dir(serve)
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
        "--max-stop", type=int, default=16, help="most stop strings per request (default: 16)"
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


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from specdec.progress import progress_bar
    from specdec.server.setup import build_app, load_scheduler

    if (
        args.max_active < 1
        or args.max_queue < 0
        or args.max_rows < 1
        or args.prefill_rows < 0
        or args.prefix_cache_mb < 0
    ):
        raise UsageError(
            "--max-active and --max-rows must be >= 1, --max-queue, --prefill-rows and "
            "--prefix-cache-mb >= 0"
        )
    if args.replicas is None or args.address is None:  # a Ray cluster joined binds elsewhere
        check_listen(args.host, args.port)  # before the models load, not after
    if args.replicas is not None:
        return _serve_replicas(args)
    config = server_config(args, threads=None)  # bad flags fail before any loading
    with progress_bar() as progress:
        scheduler = load_scheduler(config, progress)
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


def check_listen(host: str, port: int) -> None:
    """Whether this process could listen on host:port now (a UsageError if not): a port
    already taken or an address this machine does not have is reported before the models
    load, not after. Each address the host resolves to is bound as asyncio's server binds
    them (uvicorn's), then closed at once; the server binds its own."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise UsageError(f"--host {host}: {error.strerror}") from None
    for family, kind, proto, _, address in dict.fromkeys(found):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, True)
            try:
                probe.bind(address)
            except OSError as error:
                taken = error.errno == errno.EADDRINUSE
                hint = "; another server is listening there: stop it or pick another --port"
                raise UsageError(
                    f"cannot listen on {host}:{port}: {error.strerror}{hint if taken else ''}"
                ) from None


def server_config(args: argparse.Namespace, threads: int | None):
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
        draft_vocab=args.draft_vocab,
        cache_dir=args.cache_dir,
        drafter=args.drafter,
        k=args.k,
        max_active=args.max_active,
        max_queue=args.max_queue,
        max_rows=args.max_rows,
        batching=args.batching,
        prefix_sharing=args.prefix_sharing,
        prefill_rows=args.prefill_rows or None,
        prefix_cache_mb=args.prefix_cache_mb,
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

    config = server_config(args, threads=max(1, int(args.replica_cpus)))
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
