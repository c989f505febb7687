"""Which target a set of heads (or their training data) belongs to."""

from __future__ import annotations

import hashlib

import torch


def target_fingerprint(model) -> str:
    """A checksum of what heads depend on in a transformers target: its architecture, its
    token embeddings (every 64th row) and its final norm. Heads and data made for another
    target (another model, or a fine-tune of it) carry another fingerprint and are refused.
    The int8 runtime keeps these weights in float32, so float32 and int8 share a
    fingerprint (their features differ by rounding only); bfloat16 has its own."""
    config = model.config
    digest = hashlib.sha256()
    for key in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size"):
        digest.update(f"{key}={getattr(config, key, None)};".encode())
    embedding = model.get_input_embeddings()  # rows looked up: a table in GGUF blocks too
    with torch.no_grad():
        rows = embedding(torch.arange(0, embedding.num_embeddings, 64))
    digest.update(rows.float().contiguous().numpy().tobytes())
    decoder = model.get_decoder()
    for name, tensor in sorted(decoder.norm.state_dict().items()):
        digest.update(name.removeprefix("inner.").encode())
        digest.update(tensor.detach().to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]
