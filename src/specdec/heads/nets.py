"""The head networks. Both read the target's final-norm feature ``f_i`` of a position i and
end in the target's own output layer, restricted to a trimmed vocabulary (passed in, not
owned: it is the target's, and not saved with the heads).

- ``MedusaHeads`` (Cai et al. 2024): head j (1-based) maps ``f_i`` through one residual
  block to a feature for the token j + 1 positions ahead. All heads run at once: a chain of
  k drafts costs one small batched pass.
- ``EagleHead`` (Li et al. 2024, EAGLE-1 shape): one decoder layer of the target's own
  architecture over ``fc([embedding(t_{i+1}), f_i])`` predicts ``f_{i+1}``; drafting runs
  it autoregressively on its own predictions, over its own small KV cache.

Positions line up with the engine's cache invariant: the target has scored every context
token but the last, so the newest feature is ``f_{n-2}`` and the newest token ``t_{n-1}``;
Medusa's head 1 and EAGLE's first step both predict token n.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

KINDS = ("medusa", "eagle")


@dataclass(frozen=True)
class HeadsConfig:
    """What ``config.json`` records beside the weights."""

    kind: str  # "medusa" | "eagle"
    fingerprint: str  # the target's (heads.fingerprint)
    hidden_size: int
    vocab_size: int  # the target's logits width
    token_ids: list[int]  # the trimmed vocabulary the heads score
    num_heads: int = 4  # medusa
    intermediate_size: int = 4096  # eagle
    target_config: dict = field(default_factory=dict)  # eagle: the architecture to copy
    training: dict = field(default_factory=dict)  # tokens seen, minutes, losses

    @property
    def vocab_count(self) -> int:
        return len(self.token_ids)

    def to_dict(self) -> dict:
        return asdict(self) | {"vocab_count": self.vocab_count}

    @classmethod
    def from_dict(cls, payload: dict) -> HeadsConfig:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in payload.items() if k in known})


class MedusaHeads(nn.Module):
    """features  # [..., hidden] -> [..., num_heads, hidden]"""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        blocks = [nn.Linear(hidden_size, hidden_size) for _ in range(num_heads)]
        for block in blocks:  # Medusa's init: each head starts as the identity
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.blocks = nn.ModuleList(blocks)

    def forward(self, features: torch.Tensor, count: int | None = None) -> torch.Tensor:
        blocks = self.blocks[: count or self.num_heads]
        return torch.stack(
            [features + nn.functional.silu(block(features)) for block in blocks], dim=-2
        )


class EagleHead(nn.Module):
    """(features, token embeddings)  # [batch, pairs, hidden] each -> predicted next
    features  # [batch, pairs, hidden]; pair i is (f_i, embedding of t_{i+1})."""

    def __init__(self, target_config: dict, intermediate_size: int):
        super().__init__()
        from transformers import AutoConfig, AutoModel

        config = AutoConfig.for_model(**_one_layer(target_config, intermediate_size))
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden)
        self.body = AutoModel.from_config(config)

    def join(self, features: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """The layer's input for pairs (f_i, embedding of t_{i+1})  # [batch, pairs, hidden]."""
        return self.fc(torch.cat([embeddings, features], dim=-1))

    def forward(self, features, embeddings, cache=None, positions=None, mask=None) -> torch.Tensor:
        """``positions``  # [1, pairs] and ``mask``  # [1, 1, pairs, keys] bool (True:
        attend) default to the next positions of ``cache`` and a causal mask; training's
        unrolled steps (train.unrolled) pass their own."""
        x = self.join(features, embeddings)
        out = self.body(
            inputs_embeds=x,
            cache=cache,
            use_cache=cache is not None,
            position_ids=positions,
            attention_mask=mask,
        )
        return out.last_hidden_state


def start_from_target(head: EagleHead, layer: dict[str, torch.Tensor], norm: torch.Tensor) -> None:
    """Start EAGLE's layer as the target's last decoder layer (``layer``: its tensors by
    name within the layer, ``self_attn.q_proj.weight`` ...) and its final norm ``norm``,
    instead of random weights: the layer the head imitates is the one that makes the
    features it predicts. A narrower MLP keeps the target's channels i of the largest
    ``|gate_i| |up_i| |down_i|`` (row, row and column norms: the channels that move the
    output most, in their order); a wider one all of them, first, its other channels
    random as built (a zero channel would get no gradient). ``fc`` starts as the feature's
    identity, its embedding half zero: the layer first reads f_i and learns the token's
    part. MEASURED (held out, the same 500 training steps, docs/notes/heads.md "Starting from the
    target's last layer"): first draft accepted 0.533 on chat against 0.467 from random
    weights, code level."""
    own = head.body.layers[0]
    params = {name for name, _ in own.named_parameters()}
    state = {n: t for n, t in layer.items() if n in params and not n.startswith("mlp.")}
    gate, up, down = (layer[f"mlp.{name}_proj.weight"] for name in ("gate", "up", "down"))
    width = min(own.mlp.gate_proj.out_features, gate.shape[0])
    score = gate.float().norm(dim=1) * up.float().norm(dim=1) * down.float().norm(dim=0)
    keep = score.topk(width).indices.sort().values
    mlp = {"gate_proj": gate[keep], "up_proj": up[keep], "down_proj": down[:, keep].T}
    missing = params - set(state) - {f"mlp.{name}.weight" for name in mlp}
    if missing:
        raise ValueError(f"the target's last layer lacks {', '.join(sorted(missing))}")
    hidden = head.fc.out_features
    with torch.no_grad():
        for name, tensor in state.items():
            own.get_parameter(name).copy_(tensor)
        for name, rows in mlp.items():  # channel c: row c of gate and up, column c of down
            weight = own.mlp.get_submodule(name).weight
            (weight.T if name == "down_proj" else weight)[:width] = rows
        head.body.norm.weight.copy_(norm)
        head.fc.weight.zero_()
        head.fc.weight[:, hidden:] = torch.eye(hidden)  # join() puts the feature second
        head.fc.bias.zero_()


def _one_layer(target_config: dict, intermediate_size: int) -> dict:
    """The target's architecture cut to one decoder layer with its own MLP width, and no
    vocabulary of its own (tokens are embedded by the target's embedding)."""
    config = copy.deepcopy(target_config)
    for key in ("architectures", "_name_or_path", "transformers_version", "dtype", "torch_dtype"):
        config.pop(key, None)
    config.update(
        num_hidden_layers=1,
        intermediate_size=intermediate_size,
        vocab_size=1,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
        use_cache=True,
    )
    for key in ("layer_types",):
        if isinstance(config.get(key), list):
            config[key] = config[key][:1]
    if "max_window_layers" in config:
        config["max_window_layers"] = 1
    return config


def build(config: HeadsConfig) -> nn.Module:
    if config.kind == "medusa":
        return MedusaHeads(config.hidden_size, config.num_heads)
    if config.kind == "eagle":
        return EagleHead(config.target_config, config.intermediate_size)
    raise ValueError(f"unknown heads kind {config.kind!r}: medusa or eagle")
