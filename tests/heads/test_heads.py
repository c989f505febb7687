"""Medusa and EAGLE heads: hidden states, drafting, exactness, training, storage, CLI."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from helpers import EOS_ID, VOCAB, backend, tiny_heads, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant.convert import make_int8_batch_invariant
from specdec.cli import main
from specdec.heads import store
from specdec.heads.fingerprint import target_fingerprint
from specdec.heads.load import load_heads
from specdec.heads.train import bf16_allowed, bf16_native, training_precision
from specdec.sampling import Sampler

KINDS = ("medusa", "eagle")


@pytest.fixture(scope="module")
def trained(target_model):
    """Heads of both kinds trained for a few seconds on the tiny target's samples."""
    return {kind: tiny_heads(target_model, kind) for kind in KINDS}


# ---- hidden states ---------------------------------------------------------------------


@pytest.mark.parametrize("int8", [False, True])
def test_hidden_states_follow_forward_and_truncate(int8):
    model = tiny_llama(seed=3)
    model = make_int8_batch_invariant(model) if int8 else model
    target = backend(model)
    target.keep_hidden_states()
    rng = random.Random(0)
    tokens: list[int] = []
    for _ in range(30):
        if tokens and rng.random() < 0.35:
            keep = rng.randrange(len(tokens) + 1)
            target.truncate(keep)
            del tokens[keep:]
        else:
            new = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 6))]
            target.forward(new, last_only=rng.random() < 0.5)
            tokens += new
        if not tokens:
            continue
        fresh = backend(model)
        fresh.keep_hidden_states()
        fresh.forward(tokens)
        kept, expected = target.hidden_states(), fresh.hidden_states()
        assert kept.shape == (len(tokens), 32)
        if int8:  # the int8 runtime scores a block as its steps: bit for bit
            assert torch.equal(kept, expected)
        else:
            torch.testing.assert_close(kept, expected, rtol=1e-5, atol=1e-5)


def test_hidden_states_must_be_asked_for(target_model):
    with pytest.raises(ValueError, match="keep_hidden_states"):
        backend(target_model).hidden_states()


def test_one_hook_however_many_backends(target_model):
    norm = target_model.get_decoder().norm
    for _ in range(5):
        backend(target_model).keep_hidden_states()
    assert len(norm._forward_hooks) == 1


# ---- drafting --------------------------------------------------------------------------


def test_settings_a_checkpoint_was_not_started_with_are_refused(tmp_path):
    """Continuing cannot change the heads' shape: a --vocab-size, --num-heads (Medusa),
    --intermediate-size or --init (EAGLE) other than the checkpoint's is refused, one the
    same or left out is not."""
    from argparse import Namespace

    from specdec.heads.nets import HeadsConfig
    from specdec.heads.train import check_continuing

    config = HeadsConfig(
        kind="eagle",
        fingerprint="f",
        hidden_size=8,
        vocab_size=151936,
        token_ids=list(range(16384 + 5)),  # 16,384 asked, 5 special tokens beyond them
        intermediate_size=2048,
    )

    def check(
        vocab_size=None, num_heads=None, intermediate_size=None, kind="eagle", init=None, **kw
    ):
        args = Namespace(
            kind=kind,
            vocab_size=vocab_size,
            num_heads=num_heads,
            intermediate_size=intermediate_size,
            init=init,
        )
        check_continuing(args, config, tmp_path / ".eagle.checkpoint.pt", **kw)

    check()
    check(vocab_size=16384, intermediate_size=2048, num_heads=7)  # heads: Medusa's only
    with pytest.raises(ValueError, match="--vocab-size 32768 \\(it scores 16389 tokens\\)"):
        check(vocab_size=32768)
    with pytest.raises(
        ValueError, match="--vocab-size 8000 .*--intermediate-size 4096 .*--restart"
    ):
        check(vocab_size=8000, intermediate_size=4096)
    with pytest.raises(ValueError, match="--num-heads 3 \\(it has 4\\)"):
        check(num_heads=3, kind="medusa")
    check(init="target", started="target")
    check(init="random")  # a checkpoint from before --init started random
    with pytest.raises(ValueError, match="--init target \\(it started random\\)"):
        check(init="target")
    with pytest.raises(ValueError, match="--init random \\(it started target\\)"):
        check(init="random", started="target")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_with_heads_equals_plain(target_model, trained, kind, k):
    heads, _ = trained[kind]
    params = SamplingParams(max_tokens=37, temperature=0.0, ignore_eos=True)
    drafted = accepted = 0
    for prompt in ([4], [5, 9, 2], [7, 3] * 10):
        expected = Engine(backend(target_model)).generate(prompt, params).token_ids
        target = backend(target_model)
        out = Engine(target, heads.drafter(target)).generate(prompt, params, SpecConfig(k=k))
        assert out.token_ids == expected
        assert len(out.token_ids) == 37  # cut mid-round by max_tokens at most k's
        drafted += out.stats.drafted_tokens
        accepted += out.stats.accepted_tokens
    assert drafted > 0 and accepted > 0


@pytest.mark.parametrize("kind", KINDS)
def test_eos_inside_an_accepted_block_ends_the_output(trained, kind):
    model = tiny_llama(seed=0)  # the conftest target, EOS id 0 honoured here
    heads, _ = trained[kind]
    params = SamplingParams(max_tokens=200, temperature=0.0)
    stopped = 0
    for start in range(1, 30):
        prompt = [start, (start * 7) % VOCAB or 1]
        expected = Engine(backend(model)).generate(prompt, params)
        target = backend(model)
        out = Engine(target, heads.drafter(target)).generate(prompt, params, SpecConfig(k=4))
        assert out.token_ids == expected.token_ids
        if out.finish_reason == "stop":
            stopped += 1
            assert out.token_ids[-1] == EOS_ID and EOS_ID not in out.token_ids[:-1]
    assert stopped > 0, "no prompt reached EOS: the case is not exercised"


@pytest.mark.parametrize("kind", KINDS)
def test_draft_probs_are_distributions_on_the_trimmed_vocabulary(target_model, trained, kind):
    heads, _ = trained[kind]
    inside = torch.zeros(VOCAB, dtype=torch.bool)
    inside[heads.config.token_ids] = True
    assert not inside.all(), "the test needs a vocabulary that leaves tokens out"
    target = backend(target_model)
    drafter = heads.drafter(target)
    context = [3, 1, 4, 1, 5, 9]
    target.forward(context[:-1])
    for seed in range(20):
        sampler = Sampler(SamplingParams(temperature=0.9, top_p=0.95, seed=seed))
        proposal = drafter.propose(context, 4, sampler)
        assert proposal.draft_probs is not None and len(proposal.token_ids) == 4
        for token, row in zip(proposal.token_ids, proposal.draft_probs, strict=True):
            assert row[token] > 0 and inside[token]
            assert torch.isclose(row.sum(), torch.tensor(1.0)) and (row[~inside] == 0).all()


@pytest.mark.parametrize("kind", KINDS)
def test_heads_decline_when_the_cache_is_elsewhere(target_model, trained, kind):
    heads, _ = trained[kind]
    target = backend(target_model)
    drafter = heads.drafter(target)
    assert drafter.propose([5], 3).token_ids == []  # one token: no feature yet
    target.forward([5, 6, 7])
    assert drafter.propose([5, 6], 3).token_ids == []  # the cache is ahead of the context


def test_eagle_cache_follows_the_text_like_a_fresh_drafter(target_model, trained):
    """Proposals after many rounds equal a fresh drafter's on the same context."""
    heads, _ = trained["eagle"]
    target = backend(target_model)
    engine = Engine(target, heads.drafter(target))
    params = SamplingParams(max_tokens=30, temperature=0.0)
    out = engine.generate([2, 3, 4], params, SpecConfig(k=3))
    context = [2, 3, 4] + out.token_ids
    target.truncate(len(context) - 1)  # the engine left it there; make sure
    assert list(target.cached_token_ids) == context[:-1]
    reused = engine.drafter.propose(context, 4).token_ids
    fresh_target = backend(target_model)
    fresh = heads.drafter(fresh_target)  # before the forward: keeping features resets a cache
    fresh_target.forward(context[:-1])
    assert len(reused) == 4 and reused == fresh.propose(context, 4).token_ids


# ---- training and storage ----------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_training_lowers_the_loss(trained, kind):
    _, record = trained[kind]
    losses = record["losses"]
    assert len(losses) >= 3 and losses[-1] < 0.8 * losses[0]


def test_training_does_not_begin_a_step_that_would_end_past_its_minutes(target_model, monkeypatch):
    """Steps of 0.8 s within 2 s: two, ending at 1.6 s; a third, begun at 1.6 s, would end
    past the budget (on the 1.5B a step is 2 s, so heads make's last phase ran over)."""
    import time

    from specdec.heads import train

    real = train.medusa_loss

    def slow(*args):
        time.sleep(0.8)
        return real(*args)

    monkeypatch.setattr(train, "medusa_loss", slow)
    _, record = tiny_heads(target_model, "medusa", steps=100, minutes=2.0 / 60.0)
    assert record["steps"] == 2 and record["minutes"] < 2.0 / 60.0


def test_training_precision_is_as_asked_and_recorded(target_model):
    """--precision float32 is what CPUs without native bfloat16 train in; asked for on this
    one, the products change (the losses differ from bfloat16's) and the record says so."""
    runs = {
        precision: tiny_heads(target_model, "medusa", steps=40, precision=precision)[1]
        for precision in ("float32", "bfloat16")
    }
    assert {precision: run["precision"] for precision, run in runs.items()} == {
        "float32": "float32",
        "bfloat16": "bfloat16",
    }
    assert runs["float32"]["losses"] != runs["bfloat16"]["losses"]
    assert training_precision("auto") == ("bfloat16" if bf16_native() else "float32")
    with pytest.raises(ValueError, match="precision must be one of"):
        training_precision("float16")


def test_bf16_is_not_native_where_kernels_are_held_below_it():
    """A run held to AVX2 (the bench's stand-in for an AVX2 CPU) trains in float32 as that
    CPU would; held to an instruction set with bfloat16, or not held, the flags decide."""
    bf16 = "flags : fpu avx2 avx512f avx512_bf16"
    assert bf16_allowed(bf16, {})
    assert not bf16_allowed("flags : fpu avx2 avx512f", {})
    assert bf16_allowed("flags : fpu amx_bf16", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"})
    assert not bf16_allowed(bf16, {"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert not bf16_allowed(bf16, {"ONEDNN_MAX_CPU_ISA": "avx512_core_vnni"})
    assert bf16_allowed(bf16, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})
    assert bf16_allowed(bf16, {"ONEDNN_MAX_CPU_ISA": "ALL"})
    assert not bf16_allowed(bf16, {"ATEN_CPU_CAPABILITY": "avx2"})
    assert bf16_allowed(bf16, {"ATEN_CPU_CAPABILITY": "avx512"})


def test_step_settings_default_by_the_training_precision(capsys):
    """Without --vocab-size / --distill-every, float32 training (CPUs without native
    bfloat16) scores 16,384 tokens and EAGLE distils every 4th position, and says so; in
    bfloat16 the defaults stay 32,768 and every position. Given values are kept."""
    from argparse import Namespace

    from specdec.heads.train import step_settings

    def settings(kind, precision, vocab_size=None, distill_every=None):
        args = Namespace(
            kind=kind, precision=precision, vocab_size=vocab_size, distill_every=distill_every
        )
        return step_settings(args), capsys.readouterr().err

    (eagle, said) = settings("eagle", "float32")
    assert eagle == (16384, 4)
    assert "16384 most frequent tokens and EAGLE distils on every 4th position" in said
    assert "(as asked)" in said  # --precision float32 given, whatever this CPU has
    args = Namespace(kind="eagle", precision="float32", vocab_size=None, distill_every=None)
    assert step_settings(args, continuing=True) == (16384, 4)  # the checkpoint's vocabulary
    continued = capsys.readouterr().err
    assert "every 4th position" in continued and "tokens" not in continued, continued
    assert settings("medusa", "float32")[0] == (16384, 1)
    assert settings("eagle", "bfloat16") == ((32768, 1), "")
    assert settings("eagle", "float32", 32768, 1) == ((32768, 1), "")
    assert settings("eagle", "bfloat16", 20000, 2) == ((20000, 2), "")


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip_and_refusals(tmp_path, target_model, trained, kind):
    heads, _ = trained[kind]
    target = backend(target_model)
    fingerprint = target_fingerprint(target_model)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny")
    config = heads.config.to_dict() | {"fingerprint": fingerprint}
    store.save(entry, kind, config, heads.net.state_dict())
    loaded = load_heads(kind, target, str(tmp_path), "tiny")
    drafter = loaded.drafter(target)
    context = [3, 1, 4, 1, 5]
    target.forward(context[:-1])
    assert loaded.config.token_ids == heads.config.token_ids
    assert len(drafter.propose(context, 3).token_ids) == 3

    other = backend(tiny_llama(seed=4))
    with pytest.raises(ValueError, match="no .* heads trained for this target"):
        load_heads(kind, other, str(tmp_path), "tiny")
    # The same heads filed under the other target's fingerprint: refused, never used.
    other_entry = store.entry_dir(str(tmp_path), target_fingerprint(other.model), "other")
    other_entry.mkdir(parents=True)
    saved = store.current(entry, kind)
    assert saved is not None and saved.name == f"{kind}.v1"
    (other_entry / saved.name).symlink_to(saved)
    with pytest.raises(ValueError, match="trained for another target"):
        load_heads(kind, other, str(tmp_path), "other")
    weights = saved / store.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    with pytest.raises(ValueError, match="incomplete or corrupt"):
        load_heads(kind, target, str(tmp_path), "tiny")


def _saved_eagle(tmp_path, target_model, trained):
    heads, _ = trained["eagle"]
    fingerprint = target_fingerprint(target_model)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny")
    config = heads.config.to_dict() | {"fingerprint": fingerprint}
    return entry, config, heads.net.state_dict()


def test_heads_damaged_in_place_are_refused_in_one_line(tmp_path, target_model, trained):
    # Issue 45.6: a same-size change to the weights loaded silently (or raised a pickle error).
    entry, config, state = _saved_eagle(tmp_path, target_model, trained)
    directory = store.save(entry, "eagle", config, state)
    weights = directory / store.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0x01  # inside the last tensor: the file still parses
    weights.write_bytes(bytes(data))
    target = backend(target_model)
    with pytest.raises(ValueError, match="is damaged .*train them again") as refused:
        load_heads("eagle", target, str(tmp_path), "tiny")
    assert "\n" not in str(refused.value)


def test_a_save_that_dies_before_its_rename_keeps_the_heads_there_were(
    tmp_path, target_model, trained, monkeypatch
):
    # Issue 45.6: save moved the old heads aside before renaming the new ones into place, so
    # a crash between left no heads at all.
    import os

    entry, config, state = _saved_eagle(tmp_path, target_model, trained)
    store.save(entry, "eagle", config, state)
    changed = {name: tensor + 1 for name, tensor in state.items()}
    rename = os.replace

    def dies_moving_the_new_heads_in(source, destination):
        if ".tmp" in os.path.basename(source):
            raise OSError("killed")
        rename(source, destination)

    monkeypatch.setattr(os, "replace", dies_moving_the_new_heads_in)
    with pytest.raises(OSError, match="killed"):
        store.save(entry, "eagle", config, changed)
    monkeypatch.undo()
    _, loaded = store.load(entry, "eagle", config["fingerprint"])
    assert all(torch.equal(loaded[name], state[name]) for name in state)
    store.save(entry, "eagle", config, changed)  # the next save completes
    _, loaded = store.load(entry, "eagle", config["fingerprint"])
    assert all(torch.equal(loaded[name], changed[name]) for name in state)
    assert [p.name for p in entry.iterdir() if not p.name.startswith(".")] == ["eagle.v2"]


def test_a_second_trainer_of_the_same_heads_is_refused(tmp_path):
    entry = tmp_path / "entry"
    refused = pytest.raises(ValueError, match="another 'specdec heads train --kind eagle'")
    with store.training(entry, "eagle"):
        with refused, store.training(entry, "eagle"):
            pass
        with store.training(entry, "medusa"):  # another kind trains beside it
            pass
    with store.training(entry, "eagle"):  # released
        pass


def test_heads_saved_before_versions_load_and_are_saved_checked(tmp_path, target_model, trained):
    from specdec.integrity import file_digest

    entry, config, state = _saved_eagle(tmp_path, target_model, trained)
    legacy = entry / "eagle"
    legacy.mkdir(parents=True)
    torch.save(state, legacy / "heads.pt")
    (legacy / "config.json").write_text(json.dumps(config, indent=1))
    files = {name: (legacy / name).stat().st_size for name in ("heads.pt", "config.json")}
    marker = {"format": "specdec-heads/1", "kind": "eagle", "target": config["fingerprint"]}
    (legacy / store.MARKER).write_text(json.dumps(marker | {"files": files}))
    pickled = bytearray((legacy / "heads.pt").read_bytes())
    (legacy / "heads.pt").write_bytes(bytes(pickled[:40]) + bytes(len(pickled) - 40))
    with pytest.raises(ValueError, match="unreadable heads"):  # not a pickle traceback
        store.load(entry, "eagle", config["fingerprint"])
    (legacy / "heads.pt").write_bytes(bytes(pickled))
    loaded = load_heads("eagle", backend(target_model), str(tmp_path), "tiny")
    assert loaded.config.token_ids == config["token_ids"]
    current = store.current(entry, "eagle")
    assert current is not None and current.name == "eagle.v1" and not legacy.exists()
    assert file_digest(current / store.WEIGHTS)  # the checked form, from now on


@pytest.mark.parametrize("runtime", ["int4", "int8"])
def test_eagle_beside_an_int4_or_int8_target_runs_on_int4_and_stays_exact(
    tmp_path, target_model, trained, runtime, monkeypatch
):
    """Loaded for an int4 target, or an int8 one where the int4 kernel builds, EAGLE's layer
    runs on the int4 row kernels and ``fc`` is int4 too (without the kernel, beside int8:
    the layer's linears in int8, ``fc`` float32); greedy speculation still equals plain
    decoding on the target's runtime, every k."""
    import copy

    from specdec.backends.quant import kernels
    from specdec.backends.quant.convert import (
        make_int4_batch_invariant,
        make_int8_batch_invariant,
        uses_row_kernels,
    )
    from specdec.backends.quant.int4 import RowInt4Linear
    from specdec.backends.quant.int8 import RowInt8Linear

    heads, _ = trained["eagle"]
    make = make_int4_batch_invariant if runtime == "int4" else make_int8_batch_invariant
    quantized = make(copy.deepcopy(target_model))
    target = backend(quantized)
    fingerprint = target_fingerprint(quantized)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny-quantized")
    store.save(
        entry,
        "eagle",
        heads.config.to_dict() | {"fingerprint": fingerprint},
        heads.net.state_dict(),
    )
    if runtime == "int8":
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "kernel_or_none", lambda: None)  # no compiler here
            without = load_heads("eagle", target, str(tmp_path), "tiny-quantized")
        assert isinstance(without.net.fc, torch.nn.Linear)
        assert not uses_row_kernels(without.net.body)
        assert any(isinstance(m, RowInt8Linear) for m in without.net.body.modules())
        assert without.drafter(target)._stacked is None  # transformers' forward, as before
    loaded = load_heads("eagle", target, str(tmp_path), "tiny-quantized")
    assert isinstance(loaded.net.fc, RowInt4Linear) and uses_row_kernels(loaded.net.body)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    drafted = 0
    for k in range(1, 6):
        for prompt in ([4], [7, 3] * 10):
            expected = Engine(backend(quantized)).generate(prompt, params).token_ids
            target = backend(quantized)
            out = Engine(target, loaded.drafter(target)).generate(prompt, params, SpecConfig(k=k))
            assert out.token_ids == expected, f"k={k}"
            drafted += out.stats.drafted_tokens
    assert drafted > 0


# ---- the CLI on a tiny model directory -----------------------------------------------------


def test_eagle_on_int4_runs_its_layer_on_the_stack_with_transformers_bits(
    tmp_path, target_model, trained
):
    """Beside an int4 target the head's layer runs on the kernel's layer stack
    (``layer_stack.StackedDecoder``): round after round, as its cache follows the text and
    drops drafted pairs, its drafts and draft probabilities equal those of transformers'
    forward over the same layer, bit for bit."""
    import copy

    from specdec.backends.quant.convert import make_int4_batch_invariant

    heads, _ = trained["eagle"]
    quantized = make_int4_batch_invariant(copy.deepcopy(target_model))
    fingerprint = target_fingerprint(quantized)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny-int4")
    config = heads.config.to_dict() | {"fingerprint": fingerprint}
    store.save(entry, "eagle", config, heads.net.state_dict())
    targets = [backend(quantized), backend(quantized)]
    loaded = load_heads("eagle", targets[0], str(tmp_path), "tiny-int4")
    drafters = [loaded.drafter(target) for target in targets]
    assert drafters[0]._stacked is not None
    assert heads.drafter(backend(target_model))._stacked is None  # a float head: transformers
    drafters[1]._stacked = None  # transformers' forward with its DynamicCache
    context = [3, 9, 4, 4, 11, 2]
    params = SamplingParams(temperature=1.0, top_k=12, seed=7)
    samplers = [Sampler(params), Sampler(params)]
    for round_ in range(8):
        proposals = []
        for target, drafter, sampler in zip(targets, drafters, samplers, strict=True):
            target.truncate(min(len(target.cached_token_ids), len(context) - 1))
            target.forward(context[len(target.cached_token_ids) : -1])
            proposals.append(drafter.propose(context, 4, sampler))
        a, b = proposals
        assert a.token_ids == b.token_ids and len(a.token_ids) == 4, round_
        assert torch.equal(a.draft_probs, b.draft_probs), round_
        context += a.token_ids[: round_ % 3] + [round_ + 1]  # some drafts kept, then another
    assert drafters[0]._stacked.length > 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, target_model, tokenizer):
    directory = tmp_path_factory.mktemp("heads-model") / "target"
    target_model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_heads_cli_end_to_end(tmp_path, model_dir, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "the cat sat on the mat. a dog ran far, and the sun set.\n"
    (corpus / "a.txt").write_text(words * 40)
    common = ["--target", str(model_dir), "--dtype", "float32"]
    assert (
        main(
            [
                "heads",
                "data",
                "--corpus",
                str(corpus),
                "--suffix",
                ".txt",
                "--length",
                "32",
                *common,
            ]
        )
        == 0
    )
    assert "chunks of 32 tokens" in capsys.readouterr().err
    for kind in KINDS:
        unroll = ["--unroll", "2", "--learning-rate", "0.002"] if kind == "eagle" else []
        assert main(["heads", "train", "--kind", kind, "--minutes", "0.1", *unroll, *common]) == 0
        assert "saved" in (err := capsys.readouterr().err)
        assert ("unroll 2" in err) == (kind == "eagle"), err
        saved = next((tmp_path / "cache" / "heads").glob(f"*/{kind}.v*/config.json"))
        training = json.loads(saved.read_text())["training"]
        assert training["learning_rate"] == (0.002 if kind == "eagle" else 1e-3)  # as asked
        assert training.get("init") == ("target" if kind == "eagle" else None)  # the default
        assert main(["heads", "eval", "--kind", kind, "--max-k", "3", *common]) == 0
        result = json.loads(capsys.readouterr().out)
        assert len(result["acceptance_by_position"]) == 3 and result["c_per_draft"] > 0
        # --positions: every held-out chunk drafts from that many positions (first draft)
        assert main(["heads", "eval", "--kind", kind, "--positions", "5", *common]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["trials_by_position"][0] == 5 * result["held_out_chunks"]
        assert main(["heads", "eval", "--kind", kind, "--positions", "0", *common]) == 2
        err = capsys.readouterr().err
        assert "--positions must be >= 1" in err and err.count("\n") == 1, err
    model_eval = ["--kind", "model", "--draft", str(model_dir), "--draft-runtime", "transformers"]
    assert main(["heads", "eval", *model_eval, "--max-k", "3", *common]) == 0
    assert json.loads(capsys.readouterr().out)["drafter"].startswith("model-transformers")
    assert main(["heads", "list"]) == 0
    listing = capsys.readouterr().out
    assert "medusa" in listing and "eagle" in listing and "predicted speedup" in listing
    assert f"min ({training_precision()}), unroll 2" in listing  # EAGLE with --unroll 2

    outputs = {}
    for drafter in ("none", "medusa", "lookup+eagle"):
        args = ["generate", "the cat", "--drafter", drafter, "--max-tokens", "16", "--raw"]
        assert main([*args, "-k", "3", "--json", *common]) == 0
        outputs[drafter] = json.loads(capsys.readouterr().out)["token_ids"]
    assert outputs["medusa"] == outputs["none"] == outputs["lookup+eagle"]
    # The default drafter, auto, names its choice once heads are evaluated.
    auto = [
        "generate",
        "the cat",
        "--max-tokens",
        "8",
        "--raw",
        "--json",
        "--draft",
        str(model_dir),
    ]
    assert main([*auto, "--draft-runtime", "transformers", *common]) == 0
    assert "drafter auto -> " in capsys.readouterr().err
    # --unroll, with data at hand: Medusa refuses it, and it is bounded
    for args, message in [
        (["--kind", "medusa", "--unroll", "2"], "--unroll is for EAGLE"),
        (["--kind", "eagle", "--unroll", "0"], "--unroll must be in 1..8"),
    ]:
        assert main(["heads", "train", *args, "--minutes", "0.03", *common]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    # --init random starts over from random weights, and a checkpoint keeps its start
    train = ["heads", "train", "--kind", "eagle", "--minutes", "0.1", *common]
    assert main([*train, "--init", "random", "--restart"]) == 0
    saved = next((tmp_path / "cache" / "heads").glob("*/eagle.v*/config.json"))
    assert json.loads(saved.read_text())["training"]["init"] == "random"
    capsys.readouterr()
    assert main([*train, "--init", "target"]) == 2
    err = capsys.readouterr().err
    assert "--init target (it started random)" in err and err.count("\n") == 1, err


def test_heads_dtype_defaults_to_the_runtime_generate_chooses(
    tmp_path, model_dir, capsys, monkeypatch
):
    """Without --dtype the heads commands run the target on the runtime 'specdec generate'
    picks for it here (target runtime auto), so the features are the ones drafting reads."""
    import specdec.runtime

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    asked = []

    def chosen(choice, target, cache_dir=None, progress=None, dtype=None):
        asked.append((choice, target, dtype))
        return "bfloat16"

    monkeypatch.setattr(specdec.runtime, "choose_target_runtime", chosen)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat.\n" * 40)
    data = ["heads", "data", "--corpus", str(corpus), "--suffix", ".txt", "--length", "32"]
    assert main([*data, "--target", str(model_dir)]) == 0
    assert asked == [("auto", str(model_dir), None)]
    assert "the target on bfloat16" in capsys.readouterr().err
    assert main([*data, "--target", str(model_dir), "--dtype", "float32"]) == 0
    assert len(asked) == 1  # a given --dtype is used as it is
    assert "the target on float32" in capsys.readouterr().err


def test_heads_cli_errors_are_one_line(tmp_path, model_dir, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    common = ["--target", str(model_dir), "--dtype", "float32"]
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["heads", "data", "--corpus", str(empty), *common], "no .py files"),
        (["heads", "data", "--corpus", str(tmp_path / "nope"), *common], "does not exist"),
        (["heads", "data", "--minutes", "0", *common], "--minutes must be > 0"),
        (["heads", "train", "--kind", "eagle", *common], "no heads data"),
        (["heads", "train", "--kind", "eagle", "--distill-every", "0", *common], "1..64"),
        (["heads", "train", "--kind", "medusa", "--distill-every", "2", *common], "for EAGLE"),
        (["heads", "eval", "--kind", "medusa", *common], "no medusa heads trained"),
        (["generate", "hi", "--drafter", "eagle", *common], "no eagle heads trained"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_a_budget_too_small_to_train_is_one_line_and_loses_nothing(
    tmp_path, model_dir, capsys, monkeypatch
):
    """Fewer steps than the warm-up are not saved as trained heads: one line, exit 2, and a
    rerun with more minutes continues from those steps (the checkpoint keeps them)."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    common = ["--target", str(model_dir), "--dtype", "float32"]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat. a dog ran far.\n" * 40)
    data = ["heads", "data", "--corpus", str(corpus), "--suffix", ".txt", "--length", "32"]
    assert main([*data, *common]) == 0
    capsys.readouterr()
    train = ["heads", "train", "--kind", "medusa", *common]
    assert main([*train, "--minutes", "0.00001"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress line
    assert last.startswith("specdec: error: ") and "step" in last and "too few" in last, last
    assert not list((tmp_path / "cache" / "heads").glob("*/medusa/config.json"))
    assert main(["heads", "eval", "--kind", "medusa", *common]) == 2
    assert "no medusa heads trained" in capsys.readouterr().err
    # settings the checkpoint was not started with: refused, not ignored; nothing lost
    assert main([*train, "--minutes", "0.03", "--num-heads", "3"]) == 2
    said = capsys.readouterr().err
    assert "--num-heads 3 (it has 4)" in said, said
    assert "--restart" in said and said.count("\n") == 1, said
    assert main([*train, "--minutes", "0.1"]) == 0
    assert "continuing from a checkpoint" in capsys.readouterr().err


def test_heads_arguments_are_checked_before_the_target_loads(tmp_path, capsys, monkeypatch):
    """A bad value of a subcommand's own argument is one line at once, not after the
    seconds a target takes to load (and to be timed, for --dtype auto)."""
    import specdec.loading
    import specdec.runtime

    def never(*args, **kwargs):
        raise AssertionError("the target was loaded before the arguments were checked")

    monkeypatch.setattr(specdec.loading, "load_backend", never)
    monkeypatch.setattr(specdec.runtime, "choose_target_runtime", never)
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    cases = [
        (["heads", "data", "--length", "8"], "--length must be >= 16"),
        (["heads", "data", "--chat", "--corpus", "x"], "give one of --corpus, --chat"),
        (["heads", "train", "--kind", "eagle", "--minutes", "0"], "--minutes must be > 0"),
        (["heads", "train", "--kind", "eagle", "--learning-rate", "0"], "--learning-rate must"),
        (["heads", "train", "--kind", "medusa", "--unroll", "2"], "--unroll is for EAGLE"),
        (["heads", "train", "--kind", "medusa", "--init", "target"], "--init is for EAGLE"),
        (["heads", "eval", "--kind", "eagle", "--max-k", "0"], "--max-k must be in 1..16"),
        (["heads", "eval", "--kind", "eagle", "--positions", "0"], "--positions must be >= 1"),
    ]
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


# ---- the server and --drafter auto --------------------------------------------------------


def test_server_drafts_with_heads_per_request(target_model, tokenizer, trained):
    from servers import MODEL, Running, post

    heads = {kind: trained[kind][0] for kind in KINDS}
    running = Running(target_model, None, tokenizer, heads=heads, max_active=4)
    try:
        body = {"model": MODEL, "prompt": "the cat", "max_tokens": 20, "temperature": 0}
        status, plain = post(running, "/v1/completions", body | {"drafter": "none"})
        assert status == 200
        for drafter in ("medusa", "eagle", "lookup+eagle"):
            status, result = post(running, "/v1/completions", body | {"drafter": drafter})
            assert status == 200, result
            assert result["choices"][0]["text"] == plain["choices"][0]["text"]
            assert result["spec_stats"]["drafted_tokens"] > 0
        # A choice (k auto), twice: one controller for the recipe learns over both requests,
        # each member drafting (adaptive k may stop drafting on so cheap a target later).
        choice = body | {"drafter": "medusa/eagle", "num_speculative_tokens": "auto"}
        drafted = 0
        for _ in range(2):
            status, result = post(running, "/v1/completions", choice)
            assert status == 200, result
            assert result["choices"][0]["text"] == plain["choices"][0]["text"]
            drafted += result["spec_stats"]["drafted_tokens"]
        assert drafted > 0
        members = running.scheduler.controllers["medusa/eagle@8"].controllers
        assert all(c.rounds >= 2 for c in members.values())
        status, error = post(running, "/v1/completions", body | {"drafter": "model"})
        assert status == 400 and "eagle" in error["error"]["message"]
        fixed = body | {"drafter": "medusa/eagle", "num_speculative_tokens": 3}
        status, error = post(running, "/v1/completions", fixed)
        assert status == 400 and "must be 'auto'" in error["error"]["message"]
    finally:
        running.close()


def test_eval_predicts_every_k_from_its_own_pass_and_keeps_the_best():
    """Acceptance 0.5 at every position, c = 0.05 a draft, passes of 2..5 tokens at 1.1,
    1.3, 2.0, 2.6 steps (a convex int4-like curve): k = 1 gives 1.5 / 1.15, k = 2 gives
    1.75 / 1.4; the prediction is the best k's, not max_k's."""
    from specdec.heads.evaluate import Agreement, summarize

    agree = Agreement([50, 25, 12, 6], [100, 50, 24, 12])
    timing = {
        "step_s": 0.02,
        "pass_s": {2: 0.022, 3: 0.026, 4: 0.040, 5: 0.052},
        "chain_s": 0.004,  # 4 drafts at 0.001 s: c = 0.05
    }
    result = summarize(agree, timing, 4)
    expected = [1.5 / 1.15, 1.75 / 1.4, 1.875 / 2.15, 1.9375 / 2.8]
    assert result["predicted_speedup_by_k"] == [round(x, 3) for x in expected]
    assert result["best_k"] == 1 and result["predicted_speedup"] == round(1.5 / 1.15, 3)
    assert result["v"] == 2.6 and result["c_per_draft"] == 0.05


def test_auto_picks_the_best_evaluated_drafter(tmp_path, target_model, trained):
    from specdec.heads.load import NO_HEADS, auto_recipe

    target = backend(target_model)
    fingerprint = target_fingerprint(target_model)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny")
    assert auto_recipe(target, str(tmp_path), "tiny") == ("lookup+model", NO_HEADS)
    assert auto_recipe(target, str(tmp_path), "tiny", lookup_in_front=False)[0] == "model"
    heads, _ = trained["eagle"]
    store.save(entry, "eagle", heads.config.to_dict() | {"fingerprint": fingerprint}, {})
    store.save_eval(entry, "eagle", {"predicted_speedup": 0.9})
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "lookup+model" and "0.90x" in why  # heads predicted slower than plain
    # Heads predicted faster than plain, the draft model never evaluated: nothing says which
    # is faster, so both, chosen round by round (the heads alone without a choice). Prompt
    # lookup goes in front of one drafter, not of a choice.
    store.save_eval(entry, "eagle", {"predicted_speedup": 1.05})
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "model/eagle" and "draft model not evaluated" in why
    assert auto_recipe(target, str(tmp_path), "tiny", can_choose=False)[0] == "lookup+eagle"
    store.save_eval(entry, "eagle", {"predicted_speedup": 0.9})
    store.save_eval(entry, "model", {"predicted_speedup": 0.8})
    # Heads predicted fastest, the draft model evaluated too: the heads alone (a choice of
    # both ran behind the faster alone), whether or not a choice could be made.
    assert auto_recipe(target, str(tmp_path), "tiny")[0] == "lookup+eagle"
    assert auto_recipe(target, str(tmp_path), "tiny", can_choose=False)[0] == "lookup+eagle"
    store.save_eval(entry, "eagle", {"predicted_speedup": 2.1})
    store.save_eval(entry, "model", {"predicted_speedup": 1.6})
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "lookup+eagle" and "eagle 2.10x, model 1.60x" in why
    # serve's auto leaves lookup out (it ran behind under load on chat)
    assert auto_recipe(target, str(tmp_path), "tiny", lookup_in_front=False)[0] == "eagle"
    store.save_eval(entry, "medusa", {"predicted_speedup": 3.0})  # evaluated, then deleted
    assert auto_recipe(target, str(tmp_path), "tiny", can_choose=False)[0] == "lookup+eagle"
    store.save_eval(entry, "model", {"predicted_speedup": 2.5})
    assert auto_recipe(target, str(tmp_path), "tiny")[0] == "lookup+model"


def test_auto_uses_the_evaluations_made_with_the_targets_runtime(tmp_path, trained):
    """An int4 step costs about half an int8 one, so c and v (and the predictions) differ
    by runtime: an int4 target goes by evaluations made with an int4 target, and by the
    int8 ones (saying so) only where no heads were evaluated with int4."""
    from specdec.backends.quant.convert import make_int4_batch_invariant
    from specdec.heads.load import auto_recipe
    from specdec.runtime import model_runtime as target_runtime

    model = make_int4_batch_invariant(tiny_llama(seed=0))
    assert target_runtime(model) == "int4"
    assert target_runtime(tiny_llama(seed=0)) == "float32"
    assert target_runtime(make_int8_batch_invariant(tiny_llama(seed=0))) == "int8"
    target = backend(model)
    fingerprint = target_fingerprint(model)
    entry = store.entry_dir(str(tmp_path), fingerprint, "tiny")
    heads, _ = trained["eagle"]
    store.save(entry, "eagle", heads.config.to_dict() | {"fingerprint": fingerprint}, {})
    store.save_eval(entry, "eagle", {"predicted_speedup": 1.2})
    store.save_eval(entry, "model", {"predicted_speedup": 1.5})
    recipe, why = auto_recipe(target, str(tmp_path), "tiny")
    assert recipe == "lookup+model" and "(int8 target): eagle 1.20x, model 1.50x" in why
    store.save_eval(entry, "eagle", {"predicted_speedup": 1.4}, "int4")
    store.save_eval(entry, "model", {"predicted_speedup": 1.1}, "int4")
    recipe, why = auto_recipe(target, str(tmp_path), "tiny", can_choose=False)
    assert recipe == "lookup+eagle" and "(int4 target): eagle 1.40x, model 1.10x" in why
    listing = "\n".join(store.list_entries(str(tmp_path)))
    assert "int4 target" in listing and "int8 target" in listing
    # Heads trained again: their old evaluations (every runtime) no longer count.
    store.save(entry, "eagle", heads.config.to_dict() | {"fingerprint": fingerprint}, {})
    assert sorted(store.read_evals(entry)) == [("model", "int4"), ("model", "int8")]
    assert auto_recipe(target, str(tmp_path), "tiny")[0] == "lookup+model"


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

    from specdec import Engine, SamplingParams
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


def tiny_eagle_layer(target_model):
    """An untrained EAGLE layer for the tiny target, over an 8-token trimmed vocabulary."""
    from specdec.heads.nets import HeadsConfig, build

    return build(
        HeadsConfig(
            kind="eagle",
            fingerprint="tiny",
            hidden_size=target_model.config.hidden_size,
            vocab_size=target_model.config.vocab_size,
            token_ids=list(range(8)),
            intermediate_size=64,
            target_config=target_model.config.to_dict(),
        )
    )


def test_unrolled_training_steps_see_what_the_drafter_sees(target_model):
    """EAGLE-3's training-time test rehearses drafting: chain i's step s in one batched pass
    (``unrolled``, with its mask and positions) equals the drafter's way, a cache of the real
    pairs 0 .. i then one pair per step fed on the previous prediction."""
    from transformers import DynamicCache

    from specdec.heads.train import unrolled

    torch.manual_seed(0)
    net = tiny_eagle_layer(target_model).eval()
    embed = target_model.get_input_embeddings()
    tokens = torch.randint(VOCAB, (1, 14))
    with torch.no_grad():
        features = torch.randn(1, 13, target_model.config.hidden_size)  # f_0 .. f_12
        embeddings = embed(tokens[:, 1:])  # t_1 .. t_13
        steps = unrolled(net, features, embeddings, unroll=3)
        assert len(steps) == 3 and all(s.shape == features.shape for s in steps)
        for i in (0, 4, 10):
            cache = DynamicCache(config=net.body.config)
            predicted = net(features[:, : i + 1], embeddings[:, : i + 1], cache)[:, -1:]
            for step in range(1, 4):
                if step > 1:
                    t = embeddings[:, i + step - 1 : i + step]  # t_{i+step}
                    predicted = net(predicted, t, cache)
                torch.testing.assert_close(steps[step - 1][:, i : i + 1], predicted)
        # one step unrolled is EAGLE-1's pass, without a cache
        torch.testing.assert_close(unrolled(net, features, embeddings, 1)[0], steps[0])


def test_distilling_every_nth_position_is_an_unbiased_cheaper_estimate():
    """``--distill-every N`` takes the distillation term on every Nth position from a random
    offset: each draw is one of the N offsets' losses and their mean is the full loss; at
    weight 0 the output layer is not used at all (the regression alone)."""
    from specdec.heads.train import _feature_loss, distill_loss

    generator = torch.Generator().manual_seed(0)
    predicted, actual = torch.randn(2, 2, 12, 8, generator=generator)
    output = torch.randn(16, 8, generator=generator)
    teacher = actual @ output.T
    regression = torch.nn.functional.smooth_l1_loss(predicted, actual)
    full = _feature_loss(predicted, actual, output, 0.5)
    torch.testing.assert_close(full, regression + 0.5 * distill_loss(predicted @ output.T, teacher))
    for every in (2, 3, 4):
        draws = {
            round(_feature_loss(predicted, actual, output, 0.5, every).item(), 6) for _ in range(80)
        }
        assert len(draws) == every, (every, draws)  # every offset drawn, nothing else
        assert sum(draws) / every == pytest.approx(full.item(), rel=1e-5)
    assert torch.equal(_feature_loss(predicted, actual, None, 0.0), regression)


def test_eagle_at_distill_weight_0_never_runs_the_output_layer(target_model):
    from specdec.heads.train import eagle_loss

    net = tiny_eagle_layer(target_model)
    embed = target_model.get_input_embeddings()
    tokens = torch.randint(VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))
    features = torch.randn(
        2, 10, target_model.config.hidden_size, generator=torch.Generator().manual_seed(2)
    )
    output = torch.randn(8, target_model.config.hidden_size)
    losses = []
    for rows in (output, None):  # None: any use of the output layer would raise
        torch.manual_seed(3)  # the same input noise
        losses.append(eagle_loss(net, rows, tokens, features, embed, distill_weight=0.0))
    assert torch.equal(losses[0], losses[1])
    torch.manual_seed(3)
    assert not torch.equal(eagle_loss(net, output, tokens, features, embed, 0.1), losses[0])


def test_eagle_starts_as_the_targets_last_layer(target_model, model_dir):
    """``heads train --init target``: with the target's MLP width, the head's layer and final
    norm compute what the target's last layer and final norm compute, on the feature."""
    import copy

    from specdec.heads.nets import start_from_target
    from specdec.heads.train import target_layer

    net = tiny_eagle_layer(target_model)  # intermediate 64: the target's own width
    start_from_target(net, *target_layer(model_dir))
    last = copy.deepcopy(target_model.model)
    last.layers = torch.nn.ModuleList([last.layers[-1]])
    x = torch.randn(
        1, 7, target_model.config.hidden_size, generator=torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        ours = net.body(inputs_embeds=x).last_hidden_state
        theirs = last(inputs_embeds=x).last_hidden_state
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    # fc starts as the feature's identity: the layer first reads f_i, not the token
    features, embeddings = torch.randn(2, 1, 5, target_model.config.hidden_size)
    assert torch.equal(net.join(features, embeddings), features)


def test_a_narrower_eagle_mlp_keeps_the_targets_strongest_channels(
    target_model, model_dir, tmp_path
):
    import dataclasses

    from specdec.heads.nets import HeadsConfig, build, start_from_target
    from specdec.heads.train import target_layer

    layer, norm = target_layer(model_dir)
    strong = [3, 17, 40, 41, 60]
    for channel in strong:  # these channels move the output most: gate, up and down scaled
        layer["mlp.gate_proj.weight"][channel] *= 10
        layer["mlp.down_proj.weight"][:, channel] *= 10
    config = HeadsConfig(
        kind="eagle",
        fingerprint="tiny",
        hidden_size=target_model.config.hidden_size,
        vocab_size=target_model.config.vocab_size,
        token_ids=list(range(8)),
        intermediate_size=len(strong),
        target_config=target_model.config.to_dict(),
    )
    net = build(config)
    start_from_target(net, layer, norm)
    mlp = net.body.layers[0].mlp
    assert torch.equal(mlp.gate_proj.weight, layer["mlp.gate_proj.weight"][strong])
    assert torch.equal(mlp.up_proj.weight, layer["mlp.up_proj.weight"][strong])
    assert torch.equal(mlp.down_proj.weight, layer["mlp.down_proj.weight"][:, strong])
    assert torch.equal(net.body.norm.weight, norm)
    # wider than the target's 64: all of its channels first, the others as built
    wide = build(dataclasses.replace(config, intermediate_size=70))
    built = {n: w.detach().clone() for n, w in wide.body.layers[0].mlp.named_parameters()}
    start_from_target(wide, layer, norm)
    mlp = wide.body.layers[0].mlp
    assert torch.equal(mlp.gate_proj.weight[:64], layer["mlp.gate_proj.weight"])
    assert torch.equal(mlp.up_proj.weight[:64], layer["mlp.up_proj.weight"])
    assert torch.equal(mlp.down_proj.weight[:, :64], layer["mlp.down_proj.weight"])
    assert torch.equal(mlp.gate_proj.weight[64:], built["gate_proj.weight"][64:])
    assert torch.equal(mlp.down_proj.weight[:, 64:], built["down_proj.weight"][:, 64:])
    incomplete = {n: t for n, t in layer.items() if n != "self_attn.o_proj.weight"}
    with pytest.raises(ValueError, match="lacks self_attn.o_proj.weight"):
        start_from_target(build(config), incomplete, norm)
    target_model.config.to_json_file(tmp_path / "config.json")  # and no weights beside it
    with pytest.raises(ValueError, match="no last decoder layer .*--init random"):
        target_layer(tmp_path)
