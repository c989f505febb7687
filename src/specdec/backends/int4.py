"""A batch-invariant int4 CPU runtime: 4-bit weights read once for every row of a verify pass.

Why: on these memory-bound 2-core machines bytes per weight decide a step, and the int8
runtime reads 1.54 GB a step of the 1.5B against llama.cpp's Q4_K_M ~0.9 GB. The 4-bit
kernels at hand cannot verify cheaply (docs/runtime-search.md): PyTorch's int4 kernel and
llama.cpp take rows in groups of 4, so a 5-token pass costs 2.4-3.8 steps. specdec's own
kernel (``kernels/int4_linear.cpp``, compiled on first use) unpacks each block of weights
once and applies it to all rows of the pass while it sits in registers.

Format: groups of 32 inputs with a float16 scale and minimum each (w = d * code + m, code
0..15; 5 bits a weight with the scales), activations quantized per row in groups of 32 to
int8. A row's output depends on that row alone, computed in a fixed order by one thread
(the kernel's header has the argument): block == steps bit for bit at any thread count,
and the AVX-512, AVX2 and scalar paths agree bit for bit too. The rest of the model runs as
on the int8 runtime (fused projections, token-by-token norms and activations, row attention).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel

from specdec.models import ModelError

GROUP = 32  # inputs per scale
TILE = 16  # output columns per packed block
BLOCK = 320  # bytes per (tile, group): 256 code bytes, 16 float16 scales, 16 float16 minimums
KERNEL_FILES = tuple(
    Path(__file__).with_name("kernels") / name
    for name in ("int4_linear.cpp", "row_ops.cpp", "layer_stack.cpp", "lanes.h")
)
SOURCES = tuple(path for path in KERNEL_FILES if path.suffix == ".cpp")
PATHS = {0: "scalar", 1: "AVX2", 2: "AVX-512 VNNI"}

_kernel = None
_kernel_lock = threading.Lock()
_failed: Exception | None = None  # this process's failed build: not tried again


class KernelUnavailable(ModelError):
    """The int4 kernel could not be compiled or loaded here (no C++ compiler, ...): the CLI
    prints its message as one line."""


def kernel_dir() -> Path:
    """Where the compiled kernel lives: $SPECDEC_KERNELS, else ~/.cache/specdec/kernels. Not
    under --cache-dir or $SPECDEC_CACHE: a kernel belongs to the machine and its builds, not
    to a model cache (a test suite with a fresh model cache still compiles once)."""
    configured = os.environ.get("SPECDEC_KERNELS")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "specdec" / "kernels"


def kernel():
    """The compiled kernel module, built on first use (about 20 s) into ``kernel_dir()``,
    keyed by the source, torch and Python versions. A build that failed is not tried again
    in the same process (every int8 model load asks, ``kernel_or_none``)."""
    global _kernel, _failed
    if _kernel is not None:  # every linear layer of every step asks: no lock once loaded
        return _kernel
    with _kernel_lock:
        if _kernel is None:
            if _failed is not None:
                raise KernelUnavailable(str(_failed))
            try:
                _kernel = _build(held_build())
            except KernelUnavailable as error:
                _failed = error
                raise
        return _kernel


def kernel_or_none():
    """The kernel where it builds here (compiled now if it is not yet: said in a line on
    stderr), else None, the failure said in a line once. For what runs with or without it
    (the int8 runtime's row operations)."""
    fresh = _failed is None
    if fresh and not kernel_ready():
        sys.stderr.write(
            "specdec: compiling specdec's int4 kernel (once, about 20 s; the int8 runtime "
            "runs its row operations too)\n"
        )
    try:
        return kernel()
    except KernelUnavailable as error:
        if fresh:
            sys.stderr.write(f"specdec: the int8 runtime runs torch's forms here: {error}\n")
        return None


def kernel_ready() -> bool:
    """Whether the kernel is loaded in this process or built in the cache already (so that
    loading it takes a moment, not a compile)."""
    if _kernel is not None:
        return True
    return any((kernel_dir() / (kernel_name() + held_build())).glob("*.so"))


@functools.cache
def kernel_name() -> str:
    """The kernel's module name: keyed by its source, torch's and Python's versions."""
    source = b"".join(path.read_bytes() for path in KERNEL_FILES)
    key = hashlib.sha256(source + torch.__version__.encode() + sys.version.encode())
    return f"specdec_int4_{key.hexdigest()[:16]}"


# Builds of the kernel, by the suffix of their names: the usual one compiles the vectorized
# loops of the row operations and the activation quantizer as AVX-512, AVX2 and baseline
# clones, one chosen by the CPU when the library loads; the others leave out the wider ones.
BUILDS = {"": [], "_avx2": ["-DSPECDEC_UP_TO_AVX2"], "_baseline": ["-DSPECDEC_BASELINE_ONLY"]}


def held_build() -> str:
    """The build this process loads: the usual one, or where ``$SPECDEC_INT4_PATH`` pins the
    int4 product to its AVX2 (scalar) code, the build whose row operations stop at AVX2
    (baseline code) too, so that the one variable holds all of specdec's kernels (the clones
    agree bit for bit; only the time differs)."""
    try:
        path = pinned_path()
    except ValueError:  # refused with its message where a layer is made; the usual build here
        return ""
    return {1: "_avx2", 0: "_baseline"}.get(path, "")


def built(build: str = ""):
    """The kernel's build ``build`` (a key of ``BUILDS``), compiled on first use: ``kernel()``
    where it is the build this process runs, else loaded beside it (for tests)."""
    return kernel() if build == held_build() else _other_build(build)


@functools.cache
def _other_build(build: str):
    return _build(build)


def _build(build: str = ""):
    from torch.utils import cpp_extension

    name = kernel_name() + build
    directory = kernel_dir() / name
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with _only_builder(directory):
            return cpp_extension.load(
                name=name,
                sources=[str(path) for path in SOURCES],
                build_directory=str(directory),
                extra_cflags=["-O3", "-ffp-contract=off", "-fopenmp", *BUILDS[build]],
                extra_ldflags=["-fopenmp"],
                verbose=bool(os.environ.get("SPECDEC_VERBOSE_BUILD")),
            )
    except (OSError, RuntimeError, ImportError) as error:
        raise KernelUnavailable(
            f"the int4 kernel did not build ({str(error).strip().splitlines()[-1]}); it needs a "
            "C++ compiler (g++) and ninja: use --target-runtime int8 instead"
        ) from error


@contextlib.contextmanager
def _only_builder(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` while torch loads (and if need be compiles)
    the kernel there. torch serializes builds with a plain file named ``lock`` that it
    deletes when done; a process killed in between (even while only loading a built kernel,
    which takes the same lock) leaves it behind, and every later load then waits for it
    forever. The kernel lock here is an OS lock, released when its holder dies, so whoever
    holds it knows no live process is inside a build of this directory and removes a
    leftover ``lock``."""
    import fcntl

    with (directory / "specdec.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes or its holder dies
        (directory / "lock").unlink(missing_ok=True)
        yield


def best_path() -> int:
    """The kernel's code path on this CPU: 2 AVX-512 VNNI, 1 AVX2, 0 scalar."""
    return int(kernel().best_path())


PATH_BY_NAME = {"avx512": 2, "avx2": 1, "scalar": 0}  # PATHS, by the names users give
PATH_VARIABLE = "SPECDEC_INT4_PATH"


def pinned_path() -> int:
    """The code path new layers run: ``$SPECDEC_INT4_PATH`` (avx512, avx2, scalar) pins one,
    to measure here what a CPU without AVX-512 would do (the paths agree bit for bit; the row
    operations follow, ``held_build``); else -1, the best for this CPU. A path this CPU lacks
    is refused when the layer first runs."""
    name = os.environ.get(PATH_VARIABLE, "").strip().lower()
    if not name:
        return -1
    if name not in PATH_BY_NAME:
        raise ValueError(f"{PATH_VARIABLE}={name!r}: expected one of {', '.join(PATH_BY_NAME)}")
    return PATH_BY_NAME[name]


def quantize_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4-bit codes per group of 32 inputs.  weight  # [out, in] -> (codes uint8 [out, in],
    scales float16 [out, in / 32], minimums float16 [out, in / 32]); w ~ scale * code + min.
    The codes are rounded against the float16 scale and minimum that are stored."""
    rows, width = weight.shape
    grouped = weight.float().reshape(rows, width // GROUP, GROUP)
    low, high = grouped.amin(-1), grouped.amax(-1)
    minimum = low.half()
    scale = ((high - minimum.float()) / 15).half()
    safe = scale.float().clamp(min=torch.finfo(torch.float16).tiny).unsqueeze(-1)
    codes = ((grouped - minimum.float().unsqueeze(-1)) / safe).round_().clamp_(0, 15)
    codes = torch.where(scale.unsqueeze(-1) == 0, torch.zeros_like(codes), codes)
    return codes.to(torch.uint8).reshape(rows, width), scale, minimum


def pack(codes: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor) -> torch.Tensor:
    """The kernel's layout (``kernels/int4_linear.cpp``): uint8 [out / 16, in / 32, 320]."""
    rows, width = codes.shape
    tiles, groups = rows // TILE, width // GROUP
    # [tile, column, group, quad, 4] -> [tile, group, quad, column, 4]
    quads = codes.reshape(tiles, TILE, groups, 8, 4).permute(0, 2, 3, 1, 4)
    quads = quads.reshape(tiles, groups, 8, TILE * 4)
    nibbles = quads[:, :, :4] | (quads[:, :, 4:] << 4)  # chunk q: quad q low, quad q + 4 high
    per_tile = (tiles, TILE, groups)
    d = scales.reshape(per_tile).permute(0, 2, 1).contiguous().view(torch.uint8)
    m = minimums.reshape(per_tile).permute(0, 2, 1).contiguous().view(torch.uint8)
    return torch.cat([nibbles.reshape(tiles, groups, 256), d, m], dim=-1).contiguous()


def unpack(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pack``'s inverse: (codes uint8 [out, in], scales, minimums float16 [out, in / 32])."""
    tiles, groups, _ = packed.shape
    nibbles = packed[:, :, :256].reshape(tiles, groups, 4, TILE * 4)
    quads = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=2)  # [tile, group, quad, column * 4]
    codes = quads.reshape(tiles, groups, 8, TILE, 4).permute(0, 3, 1, 2, 4)
    codes = codes.reshape(tiles * TILE, groups * GROUP)

    def halves(start: int) -> torch.Tensor:
        raw = packed[:, :, start : start + 2 * TILE].contiguous().view(torch.float16)
        return raw.permute(0, 2, 1).reshape(tiles * TILE, groups)  # [tile, group, col] -> rows

    return codes.contiguous(), halves(256), halves(288)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor) -> torch.Tensor:
    """The float32 weight the codes stand for (for tests and quality checks)."""
    rows, width = codes.shape
    grouped = codes.float().reshape(rows, width // GROUP, GROUP)
    weight = grouped * scales.float().unsqueeze(-1) + minimums.float().unsqueeze(-1)
    return weight.reshape(rows, width)


def fits(linear: nn.Linear) -> bool:
    """Whether the kernel takes this layer's shape (outputs a multiple of 16, inputs of 32)."""
    return linear.out_features % TILE == 0 and linear.in_features % GROUP == 0


class RowInt4Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        codes, scales, minimums = quantize_groups(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self._set(pack(codes, scales, minimums), bias)

    @classmethod
    def from_packed(cls, packed: torch.Tensor, bias: torch.Tensor | None) -> RowInt4Linear:
        """From ``packed`` (the on-disk runtime cache's tensor): no float weights."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._set(packed, bias)
        return layer

    def _set(self, packed: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.packed, self.bias = packed, bias
        self.out_features, self.in_features = packed.shape[0] * TILE, packed.shape[1] * GROUP
        self.path = pinned_path()  # -1: the best path for this CPU; tests pin one

    def rows(self, ids: torch.Tensor) -> RowInt4Linear:
        """The layer restricted to output rows ``ids`` (the same numbers for those outputs),
        padded with copies of the last to a multiple of 16 outputs: read the first
        ``len(ids)`` columns of its output."""
        padded = torch.cat([ids, ids[-1:].expand((-len(ids)) % TILE)])
        codes, scales, minimums = unpack(self.packed)
        bias = None if self.bias is None else self.bias[padded].contiguous()
        return RowInt4Linear.from_packed(
            pack(codes[padded], scales[padded], minimums[padded]), bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x  # [..., in_features]
        rows = x.reshape(-1, x.shape[-1]).float()
        out = kernel().int4_linear(rows, self.packed, self.bias, self.path)
        return out.reshape(*x.shape[:-1], self.out_features)


# Norms whose forward is ``weight * (x / sqrt(mean(x^2) + eps))`` in float32 (Gemma's adds 1
# to its weight: not here).
PLAIN_RMS_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm", "Qwen3RMSNorm"})


class RowRMSNorm(nn.Module):
    """An RMS norm computed row by row by the kernel (``kernels/row_ops.cpp``): one call for
    all rows of a pass, each row alone in a fixed order, so blocks equal steps."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        # A buffer under the norm's own name: the runtime cache saves it as the plain norm's.
        self.register_buffer("weight", norm.get_parameter("weight").detach().float().contiguous())
        self.eps = float(vars(norm)["variance_epsilon"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float().contiguous()
        return kernel().rms_norm(rows, self.weight, self.eps).reshape(x.shape)


def use_row_kernels(model: nn.Module) -> nn.Module:
    """Run an int4 or int8 model's norms, SiLU-gated products, rotary mix and attention in the
    kernel's row operations (one call per pass each, instead of some 1,000 small torch
    calls a step): plain RMS norms become ``RowRMSNorm``, fused attention and SiLU MLPs get
    the kernel. Call after ``finish_int8_model``; other modules keep the int8 runtime's
    token-by-token forms. Changed in place and returned."""
    from specdec.backends.int8 import TokenByToken
    from specdec.backends.int8_fused import FusedAttention, FusedMLP

    kernel()  # built (or refused) before any pass needs it
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            inner = child.inner if isinstance(child, TokenByToken) else child
            if type(inner).__name__ in PLAIN_RMS_NORMS and hasattr(inner, "variance_epsilon"):
                setattr(module, name, RowRMSNorm(inner))
        if isinstance(module, FusedAttention | FusedMLP) and _fits(module):
            module.row_kernels = True
    return model


def uses_row_kernels(model: nn.Module) -> bool:
    """Whether ``use_row_kernels`` gave ``model``'s attention the kernel."""
    from specdec.backends.int8_fused import FusedAttention

    return any(
        isinstance(module, FusedAttention) and module.row_kernels for module in model.modules()
    )


def _fits(module) -> bool:
    """Attention always; an MLP when its activation is SiLU and gate and up are one size."""
    from specdec.backends.int8_fused import FusedAttention

    if isinstance(module, FusedAttention):
        return True
    return _is_silu(module.act_fn) and _halves(module.sizes)


def _is_silu(act_fn: nn.Module) -> bool:
    from specdec.backends.int8 import TokenByToken

    inner = act_fn.inner if isinstance(act_fn, TokenByToken) else act_fn
    return isinstance(inner, nn.SiLU) or type(inner).__name__ in {"SiLUActivation", "SiLU"}


def _halves(sizes: list[int]) -> bool:
    return len(sizes) == 2 and sizes[0] == sizes[1]


def make_int4_batch_invariant(model: PreTrainedModel, progress=None) -> PreTrainedModel:
    """Swap every nn.Linear the kernel fits for RowInt4Linear (others for RowInt8Linear),
    fuse q/k/v and gate/up first, and run the rest as the int8 runtime does. The model must
    be float32 on the CPU; it is changed in place and returned."""
    from specdec.backends.int8 import RowInt8Linear, swap_linears

    kernel()  # fail before any work if it cannot build

    def quantized(linear: nn.Linear) -> nn.Module:
        return RowInt4Linear(linear) if fits(linear) else RowInt8Linear(linear)

    return swap_linears(model, quantized, "quantizing to int4", progress)
