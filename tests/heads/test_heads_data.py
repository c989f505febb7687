"""Chat-like training data for heads: built-in prompts, replies written in batches."""

from __future__ import annotations

import copy
import json
import re
from importlib import resources

import pytest
import torch

from helpers import backend, tiny_llama
from specdec import Engine, SamplingParams
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.cli import main
from specdec.heads.chat_prompts import builtin_prompts
from specdec.heads.data import replies
from specdec.prompting import chat_ids

# The topics of the shipped chat benchmark's prompts (bench/workloads/chat.jsonl).
BENCH_TOPICS = [
    "recursion", "tuple", "readable", "sky", "thread", "process", "variable",
    "operating system", "rest api",
]  # fmt: skip


def test_builtin_prompts_are_many_distinct_and_stable():
    prompts = builtin_prompts()
    assert len(prompts) > 1000
    assert len(set(prompts)) == len(prompts)
    assert builtin_prompts() == prompts  # a fixed order: a rerun resumes the same list
    assert builtin_prompts(seed=1) != prompts and sorted(builtin_prompts(seed=1)) == sorted(prompts)


def test_no_builtin_prompt_is_on_a_topic_of_the_chat_benchmark():
    """Heads trained on these replies are measured on the benchmark's unseen requests."""
    shipped = resources.files("specdec.bench") / "workloads" / "chat.jsonl"
    bench = [json.loads(line)["prompt"] for line in shipped.read_text().splitlines()]
    for prompt in bench:  # every benchmark prompt names one of the topics
        assert any(topic in prompt.lower() for topic in BENCH_TOPICS), prompt
    for prompt in builtin_prompts():
        assert prompt not in bench
        words = set(re.findall(r"[a-z]+", prompt.lower()))
        hits = [t for t in BENCH_TOPICS if t in prompt.lower() and set(t.split()) <= words]
        assert not hits, (prompt, hits)


def test_the_unseen_prompts_are_in_no_training_data_and_no_benchmark():
    """``heads eval``'s unseen prompts (what --drafter auto compares) are neither built-in
    chat requests nor the benchmark's prompts, and cover its four kinds of request."""
    from specdec.heads.evaluate import UNSEEN_PROMPTS

    unseen = [json.loads(line) for line in UNSEEN_PROMPTS.read_text().splitlines()]
    workloads = resources.files("specdec.bench") / "workloads"
    bench = {
        json.loads(line)["prompt"]
        for shipped in workloads.iterdir()
        if shipped.name.endswith(".jsonl")
        for line in shipped.read_text().splitlines()
    }
    builtin = set(builtin_prompts())
    assert len({u["id"] for u in unseen}) == len(unseen) == 12
    assert {u["id"].split("-")[1] for u in unseen} == {"code", "chat", "edit", "summary"}
    for u in unseen:
        assert u["prompt"] not in bench and u["prompt"] not in builtin, u["id"]
        assert u["template"] in ("raw", "chat")
        # nor does a benchmark prompt share its subject: a code prompt's first line (the
        # signature), a request's text or code below its instruction
        assert not any(_subject(u["prompt"]) == _subject(b) for b in bench), u["id"]


def _subject(prompt: str) -> str:
    first, _, rest = prompt.partition("\n")
    return rest.strip() if first[:1].isupper() and rest.strip() else first


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized_target(request, tokenizer):
    model = tiny_llama(seed=0)
    model = (make_int8_batch_invariant if request.param == "int8" else make_int4_batch_invariant)(
        model
    )
    chatty = copy.deepcopy(tokenizer)
    chatty.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    return backend(model, chatty)


def test_batched_replies_are_the_ones_written_alone(quantized_target, tmp_path):
    """Five prompts of different lengths, three at a time: each reply is the target's own
    seeded reply alone, bit for bit, and comes with the features of the passes that wrote
    it, which are a prefill's over the same text bit for bit; they come in the order they
    ended and are saved so; a rerun reads them back in that order (without features) and
    writes only the missing ones."""
    target = quantized_target
    prompts = ["hi", "the cat sat", "a", "dogs run far away", "ok then"]
    saved = tmp_path / "replies.jsonl"
    documents = list(replies(target, prompts, 10, saved, seed=5, batch=3))
    rows = [json.loads(line) for line in saved.read_text().splitlines()]
    assert sorted(row["prompt"] for row in rows) == list(range(5))
    assert [row["token_ids"] for row in rows] == [d.token_ids for d in documents]
    for row, document in zip(rows, documents, strict=True):
        prompt = chat_ids(target.tokenizer, [{"role": "user", "content": prompts[row["prompt"]]}])
        params = SamplingParams(max_tokens=10, temperature=0.7, seed=5 + row["prompt"])
        alone = Engine(backend(target.model, target.tokenizer)).generate(prompt, params)
        assert row["token_ids"] == prompt + alone.token_ids
        prefill = backend(target.model, target.tokenizer)
        prefill.keep_hidden_states()
        prefill.forward(document.token_ids[:-1])
        assert document.features is not None
        assert document.features.dtype == torch.float16
        assert torch.equal(document.features, prefill.hidden_states().to(torch.float16))
    lines = saved.read_text().splitlines()
    saved.write_text("\n".join(lines[:3]) + "\n" + lines[3][:7])  # an interrupted write
    again = list(replies(target, prompts, 10, saved, seed=5, batch=3))
    assert [d.token_ids for d in again[:3]] == [d.token_ids for d in documents[:3]]
    assert all(d.features is None for d in again[:3])  # read back: a prefill makes them
    assert again[3].features is not None and again[4].features is not None  # written again
    assert sorted(tuple(d.token_ids) for d in again) == sorted(
        tuple(d.token_ids) for d in documents
    )
    assert len(saved.read_text().splitlines()) == 5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--chat", "--corpus", "x"], "give one of --corpus, --chat, --chat-prompts"),
        (["--chat", "--batch", "0"], "--batch must be >= 1"),
        (["--chat", "--reply-temperature", "-0.5"], "--reply-temperature must be >= 0"),
        (["--chat", "--reply-temperature", "nan"], "--reply-temperature must be >= 0"),
    ],
)
def test_chat_data_arguments_are_checked(tmp_path, model_dir, capsys, monkeypatch, extra, message):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    args = ["heads", "data", "--target", str(model_dir), "--dtype", "float32", *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_builtin_chat_data_is_its_own_source(tmp_path, model_dir, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    common = ["--target", str(model_dir), "--dtype", "int8", "--length", "32"]
    chat = ["heads", "data", "--chat", "--reply-tokens", "16", "--max-tokens", "96", *common]
    assert main(chat) == 0
    err = capsys.readouterr().err
    assert re.search(r"3 chat-builtin;", err), err


def test_collecting_does_not_begin_a_pass_that_would_end_past_its_minutes(tokenizer, tmp_path):
    """Passes of 0.8 s within 2 s: two chunks, the second ending at 1.6 s; a third pass,
    begun at 1.6 s, would end past the budget (a 512-token chunk takes the 1.5B 2-6 s)."""
    import time

    from specdec.heads import data

    target = backend(tiny_llama(seed=0), tokenizer)
    real = target.forward

    def slow(*args, **kwargs):
        time.sleep(0.8)
        return real(*args, **kwargs)

    target.forward = slow
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x + 1\n" * 40)
    manifest = data.collect(
        target, [corpus], tmp_path / "data", "tiny", length=16, minutes=2.0 / 60.0
    )
    assert sum(shard["chunks"] for shard in manifest["shards"]) == 2


CODE_CORPUS = '''\
import os


def documented(path, mode="r"):
    """Open the file at path and return its first line, stripped of whitespace."""
    with open(path, mode) as handle:
        return handle.readline().strip()


@staticmethod
def decorated(x):
    """Double x and add one to the result, for numbers of any kind."""
    return 2 * x + 1


def _private(x):
    """A private helper that nobody outside this module should be calling."""
    return x


def undocumented(x):
    return x


def terse(x):
    """Return x."""
    return x


def only_a_docstring():
    """A function whose body is its docstring and nothing else at all here."""


def flatten(nested):
    """Flatten a list of lists into one list, keeping the order of the items."""
    return [item for inner in nested for item in inner]


class Box:
    def method(self):
        """A method, not a top-level function: the prompts take functions only."""
        return self
'''


def test_builtin_code_prompts_are_signatures_and_docstrings(tmp_path):
    """A public top-level function with a docstring of some length and a body, cut after
    its docstring (decorators kept); neither private, undocumented, tersely documented,
    bodiless, nested nor benchmark-named functions (``flatten`` is an unseen prompt's)."""
    from specdec.heads.code_prompts import builtin_code_prompts

    (tmp_path / "a.py").write_text(CODE_CORPUS)
    (tmp_path / "broken.py").write_text("def (:\n")  # unparsable: skipped
    prompts = builtin_code_prompts([tmp_path / "a.py", tmp_path / "broken.py"])
    assert sorted(prompts) == sorted([
        'def documented(path, mode="r"):\n    """Open the file at path and return its first '
        'line, stripped of whitespace."""\n',
        '@staticmethod\ndef decorated(x):\n    """Double x and add one to the result, for '
        'numbers of any kind."""\n',
    ])  # fmt: skip


def test_builtin_code_prompts_from_the_standard_library_avoid_every_benchmark():
    from specdec.heads import data
    from specdec.heads.code_prompts import builtin_code_prompts

    files = data.corpus_files([data.default_corpus()], data.CORPUS_SUFFIXES)
    prompts = builtin_code_prompts(files)
    assert len(prompts) > 500
    assert builtin_code_prompts(files) == prompts  # a fixed order: a rerun resumes the list
    workloads = resources.files("specdec.bench") / "workloads"
    texts = [workloads / f"{w}.jsonl" for w in ("code", "edit", "summary", "chat")]
    from specdec.heads.evaluate import UNSEEN_PROMPTS

    names = {
        name
        for text in [*texts, UNSEEN_PROMPTS]
        for line in text.read_text().splitlines()
        for name in re.findall(r"(?:def|class)\s+(\w+)", json.loads(line)["prompt"])
    }
    assert "flatten" in names and "quicksort" in names  # the check reads the prompts' names
    for prompt in prompts:
        assert re.search(r"def\s+(\w+)", prompt).group(1) not in names, prompt


def test_raw_replies_complete_the_prompt_as_it_is(quantized_target, tmp_path):
    """``template="raw"`` (code prompts): the prompt's own tokens, no chat template, then the
    target's reply to them alone."""
    target = quantized_target
    prompt = "def f(x):\n"
    [document] = replies(target, [prompt], 8, tmp_path / "r.jsonl", seed=3, template="raw")
    ids = list(target.tokenizer.encode(prompt))
    params = SamplingParams(max_tokens=8, temperature=0.7, seed=3)
    alone = Engine(backend(target.model, target.tokenizer)).generate(ids, params)
    assert document.token_ids == ids + alone.token_ids


def test_code_data_is_its_own_source(tmp_path, model_dir, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text(CODE_CORPUS)
    common = ["--target", str(model_dir), "--dtype", "int8", "--length", "32"]
    code = ["heads", "data", "--code", "--corpus", str(corpus), "--reply-tokens", "40", *common]
    assert main(code) == 0  # until the prompts run out
    err = capsys.readouterr().err
    found = re.search(r"(\d+) code;", err)
    assert found and int(found.group(1)) >= 2, err  # two replies of 40 tokens, 32 a chunk
    entry = next((tmp_path / "cache" / "heads").iterdir())
    saved = [json.loads(line) for line in (entry / "data" / "code-replies.jsonl").open()]
    assert sorted(row["prompt"] for row in saved) == [0, 1]  # both functions completed
    assert main(["heads", "data", "--code", "--chat", *common]) == 2
    assert "give one of --corpus, --chat, --chat-prompts, --code" in capsys.readouterr().err
    prose = tmp_path / "prose"
    prose.mkdir()
    (prose / "a.py").write_text("x = 1\n\n\ndef f():\n    return x\n")  # nothing documented
    assert main(["heads", "data", "--code", "--corpus", str(prose), *common]) == 2
    assert "--code: no public function with a docstring" in capsys.readouterr().err
