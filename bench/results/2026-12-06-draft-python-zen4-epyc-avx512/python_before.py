"""The Python of a forward before commit fdea6f3 beside the current one, to swap in ONE process
(``forward_ab.py``, ``generate_ab.py``): rotary cos/sin by a call per position, the trimmed
logits index-put, every product's path read each pass."""

import torch

from specdec.backends.layer_stack import LayerStack, _path
from specdec.backends.quant.rows import RotaryTokenByToken
from specdec.backends.trim import TrimmedHead

NEW = {
    "rot": RotaryTokenByToken.forward,
    "trim": TrimmedHead.forward,
    "ks": LayerStack._kernel_stack,
}


def _old_trim(self, x):
    scores = self.sub(x)[..., : len(self.token_ids)]
    out = torch.full((*scores.shape[:-1], self.vocab_size), float("-inf"))
    out[..., self.token_ids] = scores.float()
    return out


def _old_kernel_stack(self):
    tuple(_path(p) for p in self._product_list)  # what every pass read before
    return NEW["ks"](self)


OLD = {"rot": RotaryTokenByToken._computed, "trim": _old_trim, "ks": _old_kernel_stack}


def use(side: dict) -> None:
    """Swap in ``OLD`` or ``NEW``."""
    RotaryTokenByToken.forward = side["rot"]
    TrimmedHead.forward = side["trim"]
    LayerStack._kernel_stack = side["ks"]
