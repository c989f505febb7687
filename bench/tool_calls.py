"""Tool calls on the default pair, as the server makes them (``specdec.server.tools``): the
tools shown by the chat template, tool_choice "auto" (free text, calls read after), and
"required" or one function named (the output constrained to a call, its tags and keys
forced drafts); plain decoding against speculative decoding (the draft model with prompt
lookup in front, k auto, the grammar's forced tokens as drafts), greedy.

    python bench/tool_calls.py [--runtime int4] [--max-tokens 96] [--passes 2] [--out DIR]
    python bench/tool_calls.py --serve [--passes 2] [--out DIR]

Per request and system: tokens/s (medians over interleaved passes), the share of tokens the
grammar forced, mean accepted length, whether the output is identical to plain decoding's and
whether the calls read back are calls of the offered functions. One call a reply
(``parallel_tool_calls: false``), as agents that act on one call at a time ask.

``--serve``: the same requests to `specdec serve` (its defaults) through the openai client,
as an agent's two turns: the call, then the tool's result sent back for the answer
(tool_choice "auto"). One server a system (plain: ``num_speculative_tokens: 0``; speculative:
the server's default drafter, k auto), both started side by side and asked in turn (which
goes first alternates between passes), so that neither finds the other's caches. Each
conversation's first turn is sent once untimed just before it, so its prompt is in a cache
(the server copies a prefix another request's cache holds), as an agent that sends the same
tools again finds it; the second turn finds the first turn's prompt and reply there, as an
agent's next turn does. The prompt's cold prefill is what the in-process table includes.
Per turn: seconds (median) and whether both systems gave the same reply.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

from specdec import Engine, SamplingParams, SpecConfig
from specdec.bench.report import write_table
from specdec.drafters.recipe import DraftSources, build_drafter
from specdec.loading import load_backend
from specdec.machine import cpu_kind, cpu_name
from specdec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from specdec.prompting import chat_ids
from specdec.runtime import load_draft
from specdec.server.tools import Function, ToolUse, read_calls, tags_are_tokens


def function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    parameters = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


WEATHER = [
    function(
        "get_weather",
        "The current weather in a city",
        {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        ["city", "unit"],
    ),
    function(
        "get_time",
        "The current time in a time zone",
        {"timezone": {"type": "string"}},
        ["timezone"],
    ),
]
CALENDAR = [
    function(
        "create_event",
        "Put an event in the calendar",
        {
            "title": {"type": "string"},
            "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
            "duration_minutes": {"type": "integer"},
            "attendees": {"type": "array", "items": {"type": "string"}},
        },
        ["title", "date", "duration_minutes", "attendees"],
    )
]
SEARCH = [
    function(
        "search_code",
        "Search public code for examples",
        {
            "query": {"type": "string"},
            "language": {"enum": ["python", "rust", "go", "javascript", "c++"]},
            "max_results": {"type": "integer"},
        },
        ["query", "language", "max_results"],
    ),
    function("open_file", "Open a file of the project", {"path": {"type": "string"}}, ["path"]),
]
REQUESTS = {  # name: (question, tools, the function a named choice names)
    "weather": ("What's the weather like in Paris right now, in celsius?", WEATHER, "get_weather"),
    "calendar": (
        "Schedule a 30-minute meeting called Design review on 2026-12-10 with Alice and Bob.",
        CALENDAR,
        "create_event",
    ),
    "search": ("Find examples of binary search written in Rust, at most 5 results.", SEARCH, None),
}
CHOICES = ("auto", "required", "named")
CASES = [  # (request, tool_choice): every request in every mode ("named" where it names one)
    (name, choice)
    for name, (_, _, named) in REQUESTS.items()
    for choice in CHOICES
    if choice != "named" or named is not None
]
SERVED = DEFAULT_TARGET
SYSTEMS = {  # name: (drafter recipe, how it speculates)
    "plain": ("none", SpecConfig(k=0)),
    "lookup+model k auto": ("lookup+model", SpecConfig(k="auto")),
}


def tool_use(tools: list[dict], choice: str, named: str | None) -> ToolUse:
    functions = tuple(
        Function(t["function"]["name"], t["function"]["parameters"])
        for t in tools
        if choice != "named" or t["function"]["name"] == named
    )
    return ToolUse(functions, required=choice != "auto", parallel=False)


PORT = 8793
# What each tool answers for the second turn: it names the request's tool_choice, so that no
# second turn's prompt is another's (the same tools and call in two modes would otherwise be)
RESULT = '{{"status": "ok", "asked_as": "{}"}}'


def conversation(client, name: str, choice: str, speculative: bool, max_tokens: int) -> list:
    """The two turns of one request through the server: [(seconds, reply dict)] each."""
    question, tools, named = REQUESTS[name]
    tool_choice = {"type": "function", "function": {"name": named}} if choice == "named" else choice
    messages: list[dict] = [{"role": "user", "content": question}]
    extra = {} if speculative else {"num_speculative_tokens": 0}
    turns = []
    for turn in (0, 1, 2):  # 0: the first turn, untimed, to put its prompt in a cache
        began = time.perf_counter()
        reply = client.chat.completions.create(
            model=SERVED,
            messages=messages,
            tools=tools,
            tool_choice=tool_choice if turn < 2 else "auto",
            parallel_tool_calls=False,
            max_tokens=max_tokens,
            temperature=0,
            extra_body=extra,
        )
        if turn == 0:
            continue
        turns.append((time.perf_counter() - began, reply))
        message = reply.choices[0].message
        if turn == 1 and not message.tool_calls:
            break  # nothing to answer
        if turn == 1:
            messages.append(message.model_dump(exclude_unset=True))
            calls = message.tool_calls or []
            result = RESULT.format(choice)
            messages += [{"role": "tool", "tool_call_id": c.id, "content": result} for c in calls]
    return turns


def served(args) -> int:
    from openai import OpenAI
    from serving import stop, wait_ready  # bench/serving.py, beside this script

    servers = []  # one a system, so that neither finds the other's caches (BatchedModel.retire)
    for speculative in (False, True):
        log = open(f"/tmp/tool-calls-serve-{speculative}.log", "w")  # noqa: SIM115
        port = PORT + speculative
        servers.append(
            subprocess.Popen(["specdec", "serve", "--port", str(port)], stdout=log, stderr=log)
        )
    rows: dict[tuple, list] = {}
    try:
        clients = {}
        for speculative in (False, True):
            wait_ready(PORT + speculative)
            url = f"http://127.0.0.1:{PORT + speculative}/v1"
            clients[speculative] = OpenAI(base_url=url, api_key="unused", timeout=900)
            # warm-up: kernels, grammar tables
            conversation(clients[speculative], "weather", "auto", speculative, 8)
        for done in range(args.passes):
            for name, choice in CASES:
                for speculative in (False, True) if done % 2 else (True, False):
                    client = clients[speculative]
                    turns = conversation(client, name, choice, speculative, args.max_tokens)
                    for turn, (seconds, reply) in enumerate(turns, 1):
                        rows.setdefault((name, choice, turn, speculative), []).append(
                            (seconds, reply)
                        )
    finally:
        for server in servers:
            stop(server)

    def shown(reply) -> str:
        message = reply.choices[0].message
        calls = [c.function.name + " " + c.function.arguments for c in message.tool_calls or []]
        return "; ".join(calls) or (message.content or "")[:60].replace("\n", " ")

    lines = [
        "# Tool calls through `specdec serve` (its defaults), an agent's two turns, greedy",
        "",
        f"CPU: {cpu_name()} ({cpu_kind()}); {args.passes} passes, medians; a first turn's "
        "prompt sent once just before it, a second turn's prefix the first turn's.",
        "",
        "| request | tool_choice | turn | tokens | plain s | speculative s | speedup | "
        "same reply | reply |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    summary = {}
    for (name, choice, turn, speculative), runs in rows.items():
        if speculative:
            continue
        spec_runs = rows.get((name, choice, turn, True), [])
        plain_s = statistics.median(s for s, _ in runs)
        spec_s = statistics.median(s for s, _ in spec_runs)
        same = all(shown(a) == shown(b) for (_, a), (_, b) in zip(runs, spec_runs, strict=True))
        reply = spec_runs[-1][1]
        tokens = reply.usage.completion_tokens
        summary[f"{name} / {choice} / turn {turn}"] = {
            "plain_seconds": plain_s,
            "speculative_seconds": spec_s,
            "runs": {  # each pass: seconds, and where the server says the time went
                system: [
                    {"seconds": s}
                    | {
                        part: r.model_extra["spec_stats"][part]
                        for part in ("prefill_seconds", "drafter_seconds", "target_seconds")
                    }
                    for s, r in these
                ]
                for system, these in (("plain", runs), ("speculative", spec_runs))
            },
            "speedup": plain_s / spec_s,
            "tokens": tokens,
            "same_reply": same,
            "reply": shown(reply),
        }
        lines.append(
            f"| {name} | {choice} | {turn} | {tokens} | {plain_s:.2f} | {spec_s:.2f} | "
            f"{plain_s / spec_s:.2f}x | {same} | `{shown(reply)}` |"
        )
    return write_table(lines, summary, args.out, "served.md", "served.json")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="int4", choices=["int8", "int4"])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--serve", action="store_true", help="through `specdec serve` instead")
    args = parser.parse_args()
    if args.serve:
        return served(args)
    target = load_backend(DEFAULT_TARGET, args.runtime)
    draft, _ = load_draft(DEFAULT_DRAFT, args.runtime, target_runtime=args.runtime)
    sources = DraftSources(draft_model=lambda: draft)
    tokenizer = target.tokenizer
    tag_tokens = tags_are_tokens(tokenizer, target.vocab_size, target.eos_token_ids)
    rows: dict[tuple[str, str, str], list[dict]] = {}
    plain: dict[tuple[str, str], list[int]] = {}
    for _ in range(args.passes):
        for name, choice in CASES:
            question, tools, named = REQUESTS[name]
            use = tool_use(tools, choice, named)
            prompt_ids = chat_ids(tokenizer, [{"role": "user", "content": question}], tools)
            params = SamplingParams(
                max_tokens=args.max_tokens, temperature=0.0, constraint=use.grammar(tag_tokens)
            )
            for system, (recipe, spec) in SYSTEMS.items():
                target.truncate(0)
                out = Engine(target, build_drafter(recipe, sources)).generate(
                    prompt_ids, params, spec
                )
                plain.setdefault((name, choice), out.token_ids)
                reply = read_calls(out.text, use.names, ended=out.finish_reason == "stop")
                forced = out.stats.by_drafter.get("grammar", {}).get("accepted", 0)
                rows.setdefault((name, choice, system), []).append(
                    {
                        "tokens_per_second": out.stats.tokens_per_second,
                        "decode_tokens_per_second": len(out.token_ids)
                        / (out.stats.total_seconds - out.stats.prefill_seconds),
                        "tokens": len(out.token_ids),
                        "forced_share": forced / max(len(out.token_ids), 1),
                        "mean_accepted_length": out.stats.mean_accepted_length,
                        "identical_to_plain": out.token_ids == plain[(name, choice)],
                        "calls": [c.name + " " + c.arguments for c in reply.calls] if reply else [],
                        "text": out.text,
                    }
                )
    lines = [
        f"# Tool calls, default pair on {args.runtime}, at most {args.max_tokens} tokens, greedy",
        "",
        f"CPU: {cpu_name()} ({cpu_kind()}); {args.passes} interleaved passes, medians.",
        "",
        "tok/s: the whole request's tokens over its time, prefill of the prompt (the tools'",
        "descriptions included) and the draft's with it; decode: after the prefill.",
        "",
        "| request | tool_choice | system | tokens | tok/s | vs plain | decode tok/s | vs plain "
        "| forced share | mean accepted length | identical | calls read |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    summary = {}
    for name, choice in CASES:
        base = statistics.median(r["tokens_per_second"] for r in rows[(name, choice, "plain")])
        decode_base = statistics.median(
            r["decode_tokens_per_second"] for r in rows[(name, choice, "plain")]
        )
        for system in SYSTEMS:
            runs = rows[(name, choice, system)]
            tps = statistics.median(r["tokens_per_second"] for r in runs)
            decode = statistics.median(r["decode_tokens_per_second"] for r in runs)
            last = runs[-1]
            summary[f"{name} / {choice} / {system}"] = last | {
                "tokens_per_second": tps,
                "decode_tokens_per_second": decode,
                "speedup": tps / base,
                "decode_speedup": decode / decode_base,
                "identical_to_plain": all(r["identical_to_plain"] for r in runs),
            }
            calls = "; ".join(last["calls"]) or "none"
            lines.append(
                f"| {name} | {choice} | {system} | {last['tokens']} | {tps:.1f} | "
                f"{tps / base:.2f}x | {decode:.1f} | {decode / decode_base:.2f}x | "
                f"{last['forced_share']:.2f} | "
                f"{last['mean_accepted_length']:.2f} | "
                f"{all(r['identical_to_plain'] for r in runs)} | `{calls}` |"
            )
    return write_table(lines, summary, args.out, "results.md", "tool_calls.json")


if __name__ == "__main__":
    raise SystemExit(main())
