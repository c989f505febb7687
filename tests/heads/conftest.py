"""Fixtures of the heads tests: heads trained for the tiny target, and its model directory."""

from __future__ import annotations

import pytest

from helpers import tiny_heads
from specdec.heads.nets import KINDS


@pytest.fixture(scope="module")
def trained(target_model):
    """Heads of both kinds trained for a few seconds on the tiny target's samples."""
    return {kind: tiny_heads(target_model, kind) for kind in KINDS}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, target_model, tokenizer):
    directory = tmp_path_factory.mktemp("heads-model") / "target"
    target_model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
