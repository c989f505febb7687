"""Training heads (precision, budgets, unrolled steps, distillation, EAGLE's start from the
target) and storing them (versions, damage, interrupted saves, a second trainer)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import VOCAB, backend, tiny_heads, tiny_llama
from specdec.heads import store
from specdec.heads.fingerprint import target_fingerprint
from specdec.heads.load import load_heads
from specdec.heads.nets import KINDS
from specdec.heads.train import bf16_allowed, bf16_native, training_precision

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
