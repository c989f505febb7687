"""A trimmed draft vocabulary (FR-Spec): q = 0 outside the subset, exact output all the same."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import VOCAB, backend, perturbed_copy, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant.convert import make_int4_batch_invariant, make_int8_batch_invariant
from specdec.backends.trim import trim_output_layer
from specdec.cli import main
from specdec.drafters import ModelDrafter
from specdec.sampling import Sampler

SUBSET = list(range(0, VOCAB, 2)) + [1, 3, 5]  # 19 of 32 tokens


def trimmed(model, ids=SUBSET):
    trim_output_layer(model, ids)
    return model


RUNTIMES = {
    "float32": lambda model: model,
    "int8": make_int8_batch_invariant,
    "int4": make_int4_batch_invariant,
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_draft_probs_vanish_outside_the_subset_and_sum_to_one(runtime):
    model = RUNTIMES[runtime](perturbed_copy(tiny_llama(seed=0), noise=0.03, seed=1))
    drafter = ModelDrafter(backend(trimmed(model)))
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[SUBSET] = False
    for seed in range(20):
        sampler = Sampler(SamplingParams(temperature=0.9, top_p=0.95, seed=seed))
        proposal = drafter.propose([3, 1, 4, 1, 5], 4, sampler)
        assert proposal.draft_probs is not None
        for token, row in zip(proposal.token_ids, proposal.draft_probs, strict=True):
            assert token in SUBSET and row[token] > 0
            assert torch.isclose(row.sum(), torch.tensor(1.0)) and (row[outside] == 0).all()


@pytest.mark.parametrize("runtime", ["float32", "int4"])
@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_with_a_trimmed_draft_equals_plain(runtime, k):
    target = RUNTIMES[runtime](tiny_llama(seed=0))
    draft = trimmed(RUNTIMES[runtime](perturbed_copy(tiny_llama(seed=0), noise=0.03, seed=1)))
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    for prompt in ([5, 9, 2], [7] * 20):
        expected = Engine(backend(target)).generate(prompt, params).token_ids
        out = Engine(backend(target), ModelDrafter(backend(draft))).generate(
            prompt, params, SpecConfig(k=k)
        )
        assert out.token_ids == expected
        assert out.stats.accepted_tokens > 0
    # Tokens outside the subset still reach the output: the target emits them itself.
    assert set(expected) - set(SUBSET) or out.stats.drafted_tokens > 0


def test_a_trimmed_int4_layer_scores_its_tokens_as_the_full_one_does():
    model = make_int4_batch_invariant(perturbed_copy(tiny_llama(seed=0), noise=0.03, seed=1))
    wrapped = backend(model)  # trimmed below, after it was wrapped (as the CLI does)
    full = wrapped.forward([3, 1, 4, 1, 5])
    wrapped.truncate(0)
    trimmed(model)
    outside = sorted(set(range(VOCAB)) - set(SUBSET))
    for logits in (wrapped.forward([3, 1, 4, 1, 5]), backend(model).forward([3, 1, 4, 1, 5])):
        assert torch.equal(logits[:, SUBSET], full[:, SUBSET])
        assert torch.isneginf(logits[:, outside]).all()


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_float_rows_are_the_weights_a_runtime_multiplies_by(runtime):
    """What heads train against: the output layer's rows, dequantized. The float32 layer's
    rows are its weights; an int8 or int4 layer's, the weights its codes stand for (its
    products differ from them only by its rounding of the activations)."""
    from specdec.backends.trim import float_rows

    source = tiny_llama(seed=0)
    exact = source.get_output_embeddings().weight.detach().clone()
    head = RUNTIMES[runtime](source).get_output_embeddings()
    ids = [5, 0, 31, 7]
    rows = float_rows(head, ids)
    assert rows.shape == (4, exact.shape[1]) and rows.dtype == torch.float32
    step = {"float32": 0.0, "int8": exact.abs().max() / 127, "int4": exact.abs().max() / 7.5}
    assert (rows - exact[ids]).abs().max() <= step[runtime] + 1e-6
    x = torch.randn(3, exact.shape[1], generator=torch.Generator().manual_seed(0))
    # Activations are rounded to int8 with a scale of at most max|x| / 127 per row (int8) or
    # group of 32 (int4): each output moves by at most half a step times the row's |weights|.
    bound = 0.5 * x.abs().amax(1, keepdim=True) / 127 * rows.abs().sum(1)
    assert ((head(x)[:, ids].float() - x @ rows.T).abs() <= bound + 1e-5).all()


def test_vocab_build_and_its_errors(tmp_path, capsys, target_model, tokenizer):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat. the end\n" * 20)
    directory = tmp_path / "model"
    target_model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    out = tmp_path / "vocab.json"
    args = ["vocab", "build", str(corpus), "-o", str(out), "--tokenizer", str(directory)]
    assert main([*args, "--size", "5"]) == 0
    saved = json.loads(out.read_text())
    assert saved["vocab_size"] == VOCAB and 5 <= len(saved["token_ids"]) <= 6  # + <eos>
    assert "cover" in capsys.readouterr().err
    assert main([*args[:2], str(tmp_path / "missing.txt"), *args[3:]]) == 2
    assert main([*args, "--size", "0"]) == 2
    from specdec import vocab

    with pytest.raises(ValueError, match="made for a 32-token vocabulary"):
        vocab.load(out, 151936)
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match="specdec vocab build"):
        vocab.load(tmp_path / "other.json", VOCAB)


# ---- which tokens a draft scores: --draft-vocab auto, full or a file --------------------


@pytest.mark.parametrize(
    ("draft", "vocabulary", "runtime", "expected"),
    [
        ("qwen2.5-coder-0.5b-instruct", "auto", "int4", "shipped"),
        ("qwen2.5-coder-0.5b-instruct", "auto", "int8", "shipped"),
        ("qwen2.5-coder-1.5b-instruct", "auto", "int4", "shipped"),  # same family and width
        ("qwen2.5-coder-0.5b-instruct", "auto", "bfloat16", None),  # not measured there
        ("qwen2.5-coder-0.5b-instruct", "auto", "float32", None),
        ("qwen2.5-coder-0.5b-instruct", "auto", "llamacpp:q4_0", None),  # cannot trim
        ("qwen2.5-coder-0.5b-instruct", "full", "int4", None),
        ("qwen2.5-coder-0.5b-instruct", None, "int4", None),
        ("smollm2-135m-instruct", "auto", "int4", None),  # no file ships for its family
        ("/models/my-draft", "auto", "int4", None),  # not a catalog model
        ("/models/my-draft", "mine.json", "bfloat16", "mine.json"),  # a file is a file
    ],
)
def test_auto_trims_catalog_qwen_drafts_on_int8_and_int4_only(draft, vocabulary, runtime, expected):
    from specdec import vocab
    from specdec.runtime import draft_vocabulary

    chosen = draft_vocabulary(draft, vocabulary, runtime)
    assert chosen == (vocab.shipped("qwen2.5") if expected == "shipped" else expected)


def test_the_shipped_vocabulary_fits_the_qwen_drafts_and_keeps_their_special_tokens():
    """The file loads for a 151,936-logit Qwen2.5 model and no other width; it holds the end
    and chat-marker tokens every answer needs (<|endoftext|>, <|im_start|>, <|im_end|>) and a
    fifth of the vocabulary, sorted and distinct."""
    from specdec import vocab

    path = vocab.shipped("qwen2.5")
    assert path is not None and vocab.shipped("smollm2") is None
    ids = vocab.load(path, 151936)
    assert ids == sorted(set(ids)) and ids[0] >= 0 and ids[-1] < 151936
    assert {151643, 151644, 151645} <= set(ids)
    assert 20_000 < len(ids) < 40_000
    with pytest.raises(ValueError, match="made for a 151936-token vocabulary"):
        vocab.load(path, 49152)


def test_load_draft_trims_as_told(tmp_path, monkeypatch, model_dir):
    """auto takes the file shipped for a catalog draft's family (here the tiny model stands
    in for the catalog's draft, a tiny file for the shipped one), full and a non-catalog
    draft take none, a file is taken as is; the draft keeps the runtime it was asked for."""
    from specdec import runtime, vocab
    from specdec.backends.trim import TrimmedHead
    from specdec.models import DEFAULT_DRAFT
    from specdec.runtime import load_draft

    subset = tmp_path / "subset.json"
    vocab.save(subset, SUBSET, "tiny", VOCAB, {})

    def head_ids(vocabulary):
        backend, runtime = load_draft(str(model_dir), "int8", vocabulary=vocabulary)
        assert runtime.name == "int8"
        head = backend.model.get_output_embeddings()
        return head.token_ids.tolist() if isinstance(head, TrimmedHead) else None

    assert head_ids("auto") is None  # not in the catalog
    assert head_ids(str(subset)) == sorted(set(SUBSET))
    real = runtime.draft_vocabulary

    def as_catalog(draft, vocabulary, on):
        return real(DEFAULT_DRAFT if draft == str(model_dir) else draft, vocabulary, on)

    monkeypatch.setattr(runtime, "draft_vocabulary", as_catalog)
    monkeypatch.setattr(vocab, "shipped", {"qwen2.5": str(subset)}.get)
    assert head_ids("auto") == sorted(set(SUBSET))
    assert head_ids("full") is None


def test_generate_takes_draft_vocab_auto_full_and_a_file(tmp_path, capsys, model_dir):
    """The same greedy text whatever the draft scores; a bad file is one line, exit 2."""
    from specdec import vocab

    subset = tmp_path / "subset.json"
    vocab.save(subset, SUBSET, "tiny", VOCAB, {})
    base = ["generate", "ab", "--target", str(model_dir), "--draft", str(model_dir)]
    base += ["--dtype", "int8", "--max-tokens", "8", "--json", "-k", "3"]
    texts = []
    for choice in ("auto", "full", str(subset)):
        assert main([*base, "--draft-vocab", choice]) == 0
        texts.append(json.loads(capsys.readouterr().out)["text"])
    assert texts[0] == texts[1] == texts[2]
    (tmp_path / "other.json").write_text("{}")
    for bad, why in (("missing.json", "not a readable vocabulary file"), ("other.json", "made by")):
        with pytest.raises(SystemExit) as exit_code:  # refused while parsing: nothing loaded
            main([*base, "--draft-vocab", str(tmp_path / bad)])
        assert exit_code.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "argument --draft-vocab" in err and why in err
