"""Chat-like data for heads: documents cut into chunks, prompt files, the target's own
replies."""

from __future__ import annotations

import json
import re

import pytest
import torch

from helpers import backend
from specdec import Engine, SamplingParams
from specdec.cli import main

# ---- chat-like data: the target's own replies --------------------------------------------


def test_documents_are_cut_into_chunks_of_one_length():
    """Each document but its last token (no pass made its feature); a chunk's features are
    its documents' pieces, or None where one document came without."""
    from specdec.heads.data import Document, stream_chunks

    def rows(ids):  # a feature row per token, holding its id
        return torch.tensor(ids, dtype=torch.float16)[:, None].expand(-1, 3)

    documents = [
        Document([1, 2, 3, 0], rows([1, 2, 3])),
        Document([4, 5, 0], rows([4, 5])),
        Document([6, 7, 8, 9, 10, 0], rows([6, 7, 8, 9, 10])),
        Document([11]),  # nothing to give
        Document([12, 13, 14, 15, 0]),  # read back: no features
        Document([16, 17, 0], rows([16, 17])),
    ]
    got = list(stream_chunks(documents, 4))
    assert [ids for ids, _ in got] == [
        [1, 2, 3, 4],
        [5, 6, 7, 8],
        [9, 10, 12, 13],
        [14, 15, 16, 17],
    ]
    assert torch.equal(got[0][1], rows([1, 2, 3, 4]))
    assert torch.equal(got[1][1], rows([5, 6, 7, 8]))
    assert got[2][1] is None and got[3][1] is None


@pytest.mark.parametrize(
    "name, content, expected",
    [
        (
            "p.txt",
            "hello there\nsay hi\\nin two lines\n\n",
            ["hello there", "say hi\nin two lines"],
        ),
        ("p.jsonl", '{"prompt": "a"}\n\n{"prompt": "b", "id": 3}\n', ["a", "b"]),
        (
            "p.jsonl",
            '{"prompt": "a"}\n{"text": "b"}\n',
            "line 2: needs a non-empty string field 'prompt'",
        ),
        ("p.jsonl", "{not json\n", "line 1: not valid JSON"),
        ("p.txt", "\n\n", "no prompts in it"),
    ],
)
def test_chat_prompt_files_are_read_or_refused_by_line(tmp_path, name, content, expected):
    from specdec.heads.data import read_prompts

    path = tmp_path / name
    path.write_text(content)
    if isinstance(expected, list):
        assert read_prompts(path) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            read_prompts(path)


def test_replies_are_the_targets_own_and_saved_for_a_rerun(target_model, tokenizer, tmp_path):
    """prompt + the target's seeded reply, through the chat template; a rerun reads them
    back instead of generating (a cut-off last line is generated again)."""
    import copy

    from specdec.heads.data import replies
    from specdec.prompting import chat_ids

    chatty = copy.deepcopy(tokenizer)
    chatty.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    target = backend(target_model, chatty)
    saved = tmp_path / "replies.jsonl"
    first = list(replies(target, ["hi", "the cat"], 12, saved))
    prompt = chat_ids(chatty, [{"role": "user", "content": "the cat"}])
    reply = Engine(target).generate(prompt, SamplingParams(max_tokens=12, temperature=0.7, seed=1))
    assert first[1].token_ids == prompt + reply.token_ids
    assert first[1].features is None  # float32 is not batch-invariant: a prefill makes them
    lines = saved.read_text().splitlines()
    saved.write_text(lines[0] + "\n" + lines[1][:10])  # an interrupted write
    again = list(replies(target, ["hi", "the cat", "a dog"], 12, saved))
    assert [d.token_ids for d in again[:2]] == [d.token_ids for d in first]
    rows = [json.loads(line) for line in saved.read_text().splitlines()]
    assert [row["prompt"] for row in rows] == [0, 1, 2]  # the cut line made again, whole


def test_replies_at_temperature_zero_are_the_targets_greedy_ones(target_model, tokenizer, tmp_path):
    """``--reply-temperature 0``: each reply is the target's greedy one (what a draft distilled
    for greedy decoding reads), whatever its seed."""
    import copy

    from specdec.heads.data import replies
    from specdec.prompting import chat_ids

    chatty = copy.deepcopy(tokenizer)
    chatty.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    target = backend(target_model, chatty)
    got = list(replies(target, ["hi", "the cat"], 12, tmp_path / "r.jsonl", temperature=0.0))
    for text, document in zip(["hi", "the cat"], got, strict=True):
        prompt = chat_ids(chatty, [{"role": "user", "content": text}])
        greedy = Engine(target).generate(prompt, SamplingParams(max_tokens=12, temperature=0.0))
        assert document.token_ids == prompt + greedy.token_ids
    sampled = list(replies(target, ["the cat"], 12, tmp_path / "s.jsonl"))
    assert sampled[0].token_ids != got[1].token_ids  # the default still samples
    # replies of one temperature are not continued at another: refused in one line
    with pytest.raises(ValueError, match="written at temperature 0.7, not 0: give another"):
        next(replies(target, ["the cat", "hi"], 12, tmp_path / "s.jsonl", temperature=0.0))
    again = list(replies(target, ["hi", "the cat"], 12, tmp_path / "r.jsonl", temperature=0.0))
    assert [d.token_ids for d in again] == [d.token_ids for d in got]  # read back


def test_chat_data_joins_the_corpus_data_in_one_directory(tmp_path, model_dir, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat. a dog ran far.\n" * 30)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"tell me about the cat number {i}" for i in range(8)))
    common = ["--target", str(model_dir), "--dtype", "float32", "--length", "32"]
    args = ["heads", "data", "--corpus", str(corpus), "--suffix", ".txt", *common]
    assert main(args) == 0
    capsys.readouterr()
    chat = ["heads", "data", "--chat-prompts", str(prompts), "--reply-tokens", "24", *common]
    assert main(chat) == 0
    err = capsys.readouterr().err
    assert re.search(r"\d+ chat, \d+ corpus;", err) and "8 prompts" in err
    assert main(chat) == 0  # a rerun: nothing new to generate, the data stays

    def summary(text):
        return next(line for line in text.splitlines() if "chunks of" in line)

    assert summary(capsys.readouterr().err) == summary(err)
    assert main(["heads", "train", "--kind", "medusa", "--minutes", "0.1", *common[:4]]) == 0
    capsys.readouterr()
    assert main(["heads", "eval", "--kind", "medusa", "--max-k", "2", *common[:4]]) == 0
    result = json.loads(capsys.readouterr().out)
    by_source = result["by_source"]  # code and chat held out apart, and together
    assert sorted(by_source) == ["chat", "corpus"]
    assert sum(part["held_out_chunks"] for part in by_source.values()) == result["held_out_chunks"]
    for j in range(2):
        reached = [part["acceptance_by_position"][j] for part in by_source.values()]
        assert min(reached) <= result["acceptance_by_position"][j] <= max(reached)
