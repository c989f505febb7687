"""Training data for draft heads: the target's own features over local text.

The target runs over fixed-length chunks of a corpus in prefill mode (the runtime it will
verify with, so the features are the ones drafting will read) and each chunk's token ids
and final-norm features are written as float16 to numbered shard files. Nothing else is
needed: the target's next-token distribution at a position is its output layer applied to
that position's feature, so training recomputes it (over the trimmed vocabulary) instead of
storing logits. Every ``HELD_OUT``-th chunk is kept for ``specdec heads eval``.

Collection is resumable: chunks come in a fixed order, a shard is written atomically, and a
rerun skips the chunks already on disk.

Chat-like data: a corpus of source files teaches the heads code, not conversation. So the
target can also write its own replies to a list of prompts (``--chat``: the built-in ones of
``chat_prompts.py``; ``--chat-prompts``: the user's), through the chat template, sampled at
temperature 0.7 with a seed per prompt: the text the heads will have to guess when serving
chat. Prompt + reply, one after another, are cut into chunks of the same length. Their
features are the ones the target made while writing the reply: on a batch-invariant runtime
(int8, int4) a pass over a block equals its steps bit for bit, so these are the prefill's
features without a second pass over the text (``tests/heads/test_heads_data.py``); replies read
back from an earlier run, or written on another runtime, are run again in prefill. The
replies are saved as they are written (``builtin-replies.jsonl``, ``replies.jsonl``), so a
rerun continues without generating them again. Each source keeps its own count of chunks,
so all can share one data directory.

Code the target writes (``--code``): the same, for the standard library's documented functions
cut after their docstrings (``code_prompts.py``), given raw as a code prompt is, so the heads
learn the bodies the target writes rather than the library's own.
"""

from __future__ import annotations

import json
import os
import random
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = "specdec-heads-data/1"
REPLY_TEMPERATURE = 0.7  # the target's replies are sampled at this temperature by default
HELD_OUT = 20  # every 20th chunk is held out for evaluation
CHUNKS_PER_SHARD = 8
# where each source of replies keeps them (``replies``), by the source name its chunks carry
SAVED_REPLIES = {
    "chat": "replies.jsonl",
    "chat-builtin": "builtin-replies.jsonl",
    "code": "code-replies.jsonl",
}
MANIFEST = "manifest.json"
CORPUS_SUFFIXES = (".py",)  # read under corpus directories unless --suffix says otherwise


def default_corpus() -> Path:
    """The Python standard library: source text that exists on any machine with Python."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(paths: Sequence[str | Path], suffixes: Sequence[str]) -> list[Path]:
    """Files under ``paths`` (files or directories, searched recursively) with one of
    ``suffixes``, in a fixed shuffled order (so a time budget samples the whole corpus)."""
    found: set[Path] = set()
    for path in map(Path, paths):
        if path.is_file():
            found.add(path)
        elif path.is_dir():
            found.update(
                f for f in path.rglob("*") if f.is_file() and f.suffix in suffixes and _plain(f)
            )
        else:
            raise ValueError(f"corpus path {path} does not exist")
    files = sorted(found)
    random.Random(0).shuffle(files)
    if not files:
        raise ValueError(
            f"no {'/'.join(suffixes)} files under {', '.join(map(str, paths))}: "
            "point --corpus at source or text files"
        )
    return files


def _plain(path: Path) -> bool:
    """Skip test data, caches and site-packages: what remains reads like written code."""
    parts = set(path.parts)
    return not parts & {"__pycache__", "site-packages", "test", "tests", "idlelib"}


def chunks(files: Sequence[Path], tokenizer, length: int) -> Iterator[list[int]]:
    """Token chunks of exactly ``length`` ids, each from one file (a file shorter than a
    chunk is skipped; a file's tail shorter than a chunk is dropped)."""
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        ids = tokenizer.encode(text)
        for start in range(0, len(ids) - length + 1, length):
            yield ids[start : start + length]


@dataclass(frozen=True)
class Document:
    """A prompt and the target's reply, as token ids, with the target's features of every
    position but the last (the last token was sampled, never run through the target) when
    the passes that wrote the reply kept them."""

    token_ids: list[int]
    features: torch.Tensor | None = None  # [len(token_ids) - 1, hidden] float16


def stream_chunks(
    documents: Iterable[Document], length: int
) -> Iterator[tuple[list[int], torch.Tensor | None]]:
    """Documents one after another, each but its last token (no pass made its feature), cut
    into chunks of exactly ``length`` ids (the last, shorter piece dropped): (ids, their
    features, or None when a document in the chunk came without them)."""
    pending: list[int] = []
    pieces: list[tuple[int, torch.Tensor | None]] = []  # (tokens, features) of pending, by document
    for document in documents:
        ids = document.token_ids[:-1]
        if not ids:
            continue
        pending += ids
        pieces.append((len(ids), document.features))
        while len(pending) >= length:
            chunk, pending = pending[:length], pending[length:]
            taken: list[torch.Tensor | None] = []
            need = length
            while need:
                count, features = pieces.pop(0)
                used = min(count, need)
                taken.append(None if features is None else features[:used])
                if used < count:
                    pieces.insert(0, (count - used, None if features is None else features[used:]))
                need -= used
            whole = [t for t in taken if t is not None]
            yield chunk, torch.cat(whole) if len(whole) == len(taken) else None


def read_prompts(path: Path) -> list[str]:
    """Prompts from a .jsonl file (a "prompt" field a line) or a text file (one a line,
    \\n for a newline); bad lines are named."""
    from specdec.prompting import read_prompt_file

    return [line.prompt for line in read_prompt_file(path, "--chat-prompts")]


def replies(
    target,
    prompts: Sequence[str],
    reply_tokens: int,
    saved: Path,
    seed: int = 0,
    batch: int = 32,
    temperature: float = REPLY_TEMPERATURE,
    template: str = "chat",
) -> Iterator[Document]:
    """Each prompt (through the chat template, or as it is: ``template`` "raw") followed by
    the target's own reply, in the order the replies were finished, with the features the
    target made while writing it.
    Replies already in ``saved`` (a JSON line each, naming its prompt) are read back first,
    in their order there (without features), and new ones appended, so a rerun yields the
    same token ids in the same order.

    Up to ``batch`` replies are written together, one pass of the target for one token of
    each (continuous batching: a finished reply's place goes to the next prompt), where the
    target is on a batch-invariant runtime (``backends/batched.py``): every row of a pass is
    computed as it would be alone, so each reply is the one the target writes alone with its
    seed (``tests/heads/test_heads_data.py``). Measured on the 2-core AMD EPYC with the int4 1.5B:
    32 replies of 40 tokens in 11.1 s, 115 reply tokens a second with the prompts' prefill,
    where one request alone decodes about 42."""
    from specdec.prompting import encode_prompt

    done: dict[int, list[int]] = {}
    lines = saved.read_text().splitlines(keepends=True) if saved.is_file() else []
    whole = 0
    for line in lines:
        if not line.endswith("\n"):
            break  # the write of its end never happened: not sure it is whole
        try:
            record = json.loads(line)
            done[int(record["prompt"])] = [int(t) for t in record["token_ids"]]
            written_at = float(record.get("temperature", REPLY_TEMPERATURE))
        except (ValueError, KeyError, TypeError, AttributeError):
            break  # a line cut short by an interrupted run: generate from there again
        if written_at != temperature:
            raise ValueError(
                f"{saved} holds replies written at temperature {written_at:g}, not "
                f"{temperature:g}: give another --data directory (or --reply-temperature "
                f"{written_at:g})"
            )
        whole += 1
    if whole < len(lines):  # keep the whole lines only, so new ones start clean
        temporary = saved.with_suffix(".tmp")
        temporary.write_text("".join(lines[:whole]))
        temporary.replace(saved)
    yield from (Document(ids) for index, ids in done.items() if index < len(prompts))
    # A model without a chat template has no conversation format: its prompts go in raw.
    if not getattr(target.tokenizer, "chat_template", None):
        template = "raw"
    requests = [
        (index, encode_prompt(target.tokenizer, prompts[index], template))
        for index in range(len(prompts))
        if index not in done
    ]
    with saved.open("a") as out:
        written = _write_replies(target, requests, reply_tokens, seed, batch, temperature)
        for index, document in written:
            record = {"prompt": index, "token_ids": document.token_ids, "temperature": temperature}
            out.write(json.dumps(record) + "\n")
            out.flush()
            yield document


def _write_replies(
    target,
    requests: Sequence[tuple[int, list[int]]],
    reply_tokens: int,
    seed: int,
    batch: int,
    temperature: float = REPLY_TEMPERATURE,
) -> Iterator[tuple[int, Document]]:
    """(prompt index, prompt + reply) as each reply ends: sampled at ``temperature`` with
    seed ``seed + index`` (0: the target's greedy reply); ``batch`` at a time on a
    batch-invariant runtime (with the features of its passes), else one by one (features
    left to a prefill pass)."""
    from specdec import Engine, SamplingParams
    from specdec.backends.batched import BatchedModel, supports
    from specdec.engine import step_together

    def params(index: int) -> SamplingParams:
        return SamplingParams(max_tokens=reply_tokens, temperature=temperature, seed=seed + index)

    if batch <= 1 or not supports(target.model):
        for index, prompt_ids in requests:
            reply = Engine(target).generate(prompt_ids, params(index)).token_ids
            yield index, Document(prompt_ids + reply)
        return
    model = BatchedModel(target.model, target.tokenizer)  # shares the template's prefix
    waiting = list(reversed(requests))
    active: list[tuple[int, list[int], Any, Any]] = []  # (index, prompt + reply so far, run, seq)
    while waiting or active:
        while waiting and len(active) < batch:
            index, prompt_ids = waiting.pop()
            sequence = model.sequence()
            sequence.keep_hidden_states()
            run = Engine(sequence).begin(prompt_ids, params(index))
            run.start()
            active.append((index, list(prompt_ids), run, sequence))
        results = step_together([run for _, _, run, _ in active], model.forward_many)
        still = []
        for (index, document, run, sequence), result in zip(active, results, strict=True):
            if isinstance(result, Exception):
                raise result
            document += result.token_ids
            if result.finish_reason is None:
                still.append((index, document, run, sequence))
            else:
                yield index, Document(document, _features(sequence, document))
        active = still


def _features(sequence, document: list[int]) -> torch.Tensor | None:
    """The features a sequence kept while writing ``document``: every position but the
    last, float16; None if its cache holds other tokens (then a prefill pass makes them)."""
    if list(sequence.cached_token_ids) != document[:-1]:
        return None
    return sequence.hidden_states().to(torch.float16)


@dataclass(frozen=True)
class Shard:
    tokens: torch.Tensor  # [chunks, length] int64
    features: torch.Tensor  # [chunks, length, hidden] float16
    sources: tuple[str, ...] = ()  # each chunk's source ("corpus", "chat", ...), when known

    def only(self, source: str) -> Shard:
        """The chunks of one source."""
        keep = torch.tensor([s == source for s in self.sources], dtype=torch.bool)
        chosen = tuple(s for s in self.sources if s == source)
        return Shard(self.tokens[keep], self.features[keep], chosen)


def collect(
    target,
    files: Sequence[Path],
    out_dir: Path,
    fingerprint: str,
    length: int = 512,
    max_tokens: int | None = None,
    minutes: float | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    source: str = "corpus",
    documents: Iterable[Document] | None = None,
) -> dict:
    """Run ``target`` (an ``HFModel``) over the corpus chunks (or, given ``documents``,
    take chunks of those, run only where they came without features) and write shards to
    ``out_dir``; resumes where an earlier run of the same ``source`` for the same target
    stopped. Returns the manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = _read_manifest(out_dir)
    if manifest and (manifest["fingerprint"], manifest["length"]) != (fingerprint, length):
        raise ValueError(
            f"{out_dir} holds data for another target or chunk length: use a new --out"
        )
    manifest = manifest or {
        "format": FORMAT,
        "fingerprint": fingerprint,
        "length": length,
        "hidden_size": target.hidden_size,
        "shards": [],
        "seconds": 0.0,
    }
    done_chunks = sum(
        s["chunks"] for s in manifest["shards"] if s.get("source", "corpus") == source
    )
    total = max_tokens // length if max_tokens is not None else None
    budget_seconds = 60 * minutes if minutes is not None else None
    began = time.monotonic()
    deadline = began + budget_seconds if budget_seconds is not None else float("inf")
    target.keep_hidden_states()
    pending_tokens: list[list[int]] = []
    pending_features: list[torch.Tensor] = []
    started = time.monotonic()
    source_chunks = (
        ((chunk, None) for chunk in chunks(files, target.tokenizer, length))
        if documents is None
        else stream_chunks(documents, length)
    )
    what = "running the target over the corpus" if documents is None else "writing replies"
    pass_seconds = 0.0  # the target's last pass: one that would end past the budget is not run
    for index, (chunk, features) in enumerate(source_chunks):
        if index < done_chunks:
            continue
        if total is not None and index >= total:
            break
        if time.monotonic() + (pass_seconds if features is None else 0.0) > deadline:
            break
        if features is None:
            began_pass = time.monotonic()
            target.truncate(0)
            target.forward(chunk, last_only=True)
            features = target.hidden_states().to(torch.float16).clone()
            pass_seconds = time.monotonic() - began_pass
        pending_tokens.append(chunk)
        pending_features.append(features)
        if len(pending_tokens) == CHUNKS_PER_SHARD:
            _write_shard(out_dir, manifest, pending_tokens, pending_features, started, source)
            started = time.monotonic()
            pending_tokens, pending_features = [], []
        if progress is not None and total is not None:
            progress(f"{what} (chunks)", index + 1, total)
        elif progress is not None and budget_seconds is not None:
            elapsed = min(int(time.monotonic() - began), int(budget_seconds))
            progress(f"{what} (seconds)", elapsed, int(budget_seconds))
    if pending_tokens:
        _write_shard(out_dir, manifest, pending_tokens, pending_features, started, source)
    target.truncate(0)
    if not any(s.get("source", "corpus") == source for s in manifest["shards"]):
        raise ValueError(
            "the budget ended before one chunk was collected: give more time"
            + ("" if documents is None else " or more prompts (a chunk needs --length tokens)")
        )
    return manifest


def _write_shard(out_dir, manifest, tokens, features, started, source: str) -> None:
    name = f"shard-{len(manifest['shards']):05d}.pt"
    tmp = out_dir / (name + ".tmp")
    torch.save(
        {"tokens": torch.tensor(tokens, dtype=torch.long), "features": torch.stack(features)}, tmp
    )
    os.replace(tmp, out_dir / name)
    manifest["shards"].append({"file": name, "chunks": len(tokens), "source": source})
    manifest["seconds"] += time.monotonic() - started
    tmp_manifest = out_dir / (MANIFEST + ".tmp")
    tmp_manifest.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp_manifest, out_dir / MANIFEST)


def _read_manifest(out_dir: Path) -> dict | None:
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def load(data_dir: Path, fingerprint: str | None = None) -> tuple[Shard, Shard, dict]:
    """(training chunks, held-out chunks, manifest) of a collected data directory."""
    manifest = _read_manifest(data_dir)
    if manifest is None:
        raise ValueError(f"{data_dir}: no heads data here (make it with 'specdec heads data')")
    if fingerprint is not None and manifest["fingerprint"] != fingerprint:
        raise ValueError(f"{data_dir}: collected from another target than this one")
    tokens, features, sources = [], [], []
    for shard in manifest["shards"]:
        sources += [shard.get("source", "corpus")] * shard["chunks"]
        try:
            payload = torch.load(data_dir / shard["file"], weights_only=True)
        except (OSError, RuntimeError, EOFError) as error:
            raise ValueError(f"{data_dir / shard['file']}: unreadable shard ({error})") from None
        tokens.append(payload["tokens"])
        features.append(payload["features"])
    all_tokens, all_features = torch.cat(tokens), torch.cat(features)
    held = torch.arange(all_tokens.shape[0]) % HELD_OUT == HELD_OUT - 1
    return (
        Shard(all_tokens[~held], all_features[~held], _pick(sources, ~held)),
        Shard(all_tokens[held], all_features[held], _pick(sources, held)),
        manifest,
    )


def _pick(items: list[str], mask: torch.Tensor) -> tuple[str, ...]:
    return tuple(item for item, keep in zip(items, mask.tolist(), strict=True) if keep)
