"""The int4 runtime: its kernel's paths agree bit for bit, a block equals its steps bit for bit
at real layer sizes and any thread count, and speculation on it equals plain decoding; the
same for a draft's weights, a scale per 128 inputs (``int4.DRAFT_GROUP``)."""

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import backend, char_tokenizer, perturbed_copy, tiny_llama
from specdec import Engine, SamplingParams, SpecConfig
from specdec.backends.quant import int4, kernels
from specdec.backends.quant import store as int8_cache
from specdec.backends.quant.convert import make_int4_batch_invariant
from specdec.backends.quant.int4 import RowInt4Linear
from specdec.drafters import ModelDrafter
from specdec.loading import load_hf

THREADS = [1, 2, 3, 4, 8]
GROUPS = [int4.GROUP, int4.DRAFT_GROUP]


def random_linear(out_features: int, in_features: int, seed: int, bias: bool = True):
    generator = torch.Generator().manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=generator) * 0.05)
        if bias:
            layer.bias.copy_(torch.randn(out_features, generator=generator))
    return layer


def reference(layer: RowInt4Linear, codes, scales, minimums, x: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic written out in torch, float64: activations quantized per group
    of 32 to int8, integer group sums, scaled. Close to the kernel, not bit for bit (the
    kernel rounds in float32)."""
    rows, width = x.shape
    groups = x.reshape(rows, width // 32, 32)
    amax = groups.abs().amax(-1, keepdim=True)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    quantized = (groups * inverse).round().clamp(-127, 127).double()
    da = (amax / 127.0).double()
    weight = int4.dequantize(codes, scales, minimums).double()
    out = (quantized * da).reshape(rows, width) @ weight.T
    return out + (layer.bias.double() if layer.bias is not None else 0.0)


def test_quantized_weights_stay_within_half_a_step():
    weight = random_linear(64, 256, seed=1).weight.detach()
    codes, scales, minimums = int4.quantize_groups(weight)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    error = (int4.dequantize(codes, scales, minimums) - weight).abs().reshape(64, 8, 32)
    # half a quantization step, plus the float16 rounding of the scale and minimum
    bound = scales.float().unsqueeze(-1) * 0.5 + 2e-3
    assert bool((error <= bound).all())


def test_a_constant_group_is_exact():
    weight = torch.full((16, 32), 0.25)
    codes, scales, minimums = int4.quantize_groups(weight)
    assert torch.equal(int4.dequantize(codes, scales, minimums), weight)


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [5, 45])  # 45: AMX's pieces of 16, 16 and 13 where it runs
def test_the_kernel_computes_the_quantized_product(bias, group, rows):
    layer = random_linear(48, 256, seed=2, bias=bias)
    codes, scales, minimums = int4.quantize_groups(layer.weight.detach(), group)
    int4_layer = RowInt4Linear(layer, group)
    assert int4_layer.group == group and int4_layer.in_features == 256
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(3))
    x[1, :32] = 0.0  # a group of zeros
    expected = reference(int4_layer, codes, scales, minimums, x)
    assert torch.allclose(int4_layer(x).double(), expected, atol=1e-4, rtol=1e-5)


def test_activations_round_half_to_even():
    """A group whose largest value is 127 has scale 1, so its halves are rounded as they are:
    0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, -1.5 -> -2 (away from zero would differ)."""
    layer = random_linear(16, 64, seed=10, bias=False)
    codes, scales, minimums = int4.quantize_groups(layer.weight.detach())
    int4_layer = RowInt4Linear(layer)
    halves = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5])
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1:9], x[0, 32], x[0, 33:41] = 127.0, halves, -127.0, -halves
    quantized = torch.round(x).double()  # torch rounds half to even
    weight = int4.dequantize(codes, scales, minimums).double()
    expected = quantized @ weight.T
    assert torch.allclose(int4_layer(x).double(), expected, atol=1e-4, rtol=1e-6)
    away = (torch.sign(x) * torch.floor(x.abs() + 0.5)).double()  # half away from zero
    assert not torch.allclose(away @ weight.T, expected, atol=1e-4, rtol=1e-6)


def test_a_nan_or_infinity_reaches_that_rows_outputs_only():
    layer = RowInt4Linear(random_linear(32, 64, seed=8))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(9))
    clean = layer(x)
    x[0, 5], x[1, 40] = float("nan"), float("inf")
    out = layer(x)
    assert bool(out[0].isnan().all()) and bool(out[1].isnan().all())
    assert torch.equal(out[2], clean[2])


def available_paths() -> list[int]:
    return list(range(kernels.best_path() + 1))


def vector_paths() -> list[int]:
    """The AVX2, AVX-512 and AMX paths this CPU has (the scalar path where it has none)."""
    return available_paths()[1:] or [0]


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("rows", [9, 45])
@pytest.mark.parametrize("shape", [(2048, 1536), (1536, 8960), (1152, 896), (48, 64)])
def test_every_code_path_gives_the_same_bits(shape, rows, group):
    """Scalar, AVX2, AVX-512 VNNI and AMX-INT8 (those this CPU has) agree bit for bit, at the
    1.5B's and the 0.5B's layer sizes, for 9 rows and for 45 (AMX: pieces of 16, 16 and 13
    rows), a scale per 32 inputs or per 128 (64 inputs: 32 all the same)."""
    layer = RowInt4Linear(random_linear(*shape, seed=4), group)
    assert layer.group == (group if shape[1] % group == 0 else int4.GROUP)
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(5)) * 2.0
    results = []
    for path in available_paths():
        layer.path = path
        results.append(layer(x))
    assert all(torch.equal(result, results[0]) for result in results[1:])


@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("rows", [2, 3, 4, 5, 7, 8, 9, 12, 17, 32, 40, 45])
def test_a_row_does_not_depend_on_its_neighbours(threads, rows, group):
    """On every vector path this CPU has (each takes rows in passes of its own size: 8 on
    AVX-512, 4 on AVX2; on AMX passes of 32+ in pieces of 16, a last piece of under 13 on
    AVX-512) and at several thread counts."""
    layer = RowInt4Linear(random_linear(8960, 1536, seed=6), group)
    x = torch.randn(rows, 1536, generator=torch.Generator().manual_seed(rows))
    for path in vector_paths():
        layer.path = path
        torch.set_num_threads(2)
        singles = torch.cat([layer(x[i : i + 1]) for i in range(rows)])
        for count in THREADS:
            torch.set_num_threads(count)
            assert torch.equal(layer(x), singles), f"path {path}, {rows} rows, {count} threads"


def test_a_path_this_cpu_lacks_is_refused():
    layer = RowInt4Linear(random_linear(16, 32, seed=7))
    layer.path = kernels.best_path() + 1
    with pytest.raises(RuntimeError, match="not available"):
        layer(torch.randn(1, 32))


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (empty where /proc/cpuinfo is not)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split()}


def linux_lends_tiles() -> bool:
    """Whether Linux lets this process use AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM,
    Linux 5.16 and later), as the kernel asks before it takes the tile path."""
    import ctypes
    import platform

    if platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XTILEDATA


def test_the_kernel_takes_amx_where_the_cpu_has_it():
    """On a CPU with AMX-INT8 (Sapphire Rapids and later Xeons) the kernel's best path is the
    tile path, so that the agreement tests above run it; elsewhere it is never chosen."""
    flags = cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo here to read the CPU's flags from")
    has_amx = {"amx_tile", "amx_int8", "avx512_vnni"} <= flags and linux_lends_tiles()
    assert (kernels.best_path() == 3) == has_amx, f"best path {kernels.best_path()}"
    if not has_amx:
        pytest.skip("this CPU has no AMX-INT8: the tile path is checked on CPUs that have it")


def test_the_environment_pins_the_path_new_layers_run(monkeypatch):
    """$SPECDEC_INT4_PATH runs a whole program on one code path (to measure what a CPU
    without AVX-512 would do); unset, each layer takes the best; a wrong name is refused."""
    kernels.kernel()  # the process's build is the one loaded first: the usual one here
    linear = random_linear(48, 64, seed=8)
    assert RowInt4Linear(linear).path == -1
    monkeypatch.setenv("SPECDEC_INT4_PATH", "AVX2")
    pinned = RowInt4Linear(linear)
    assert pinned.path == 1 and RowInt4Linear.from_packed(pinned.packed, None).path == 1
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(9))
    monkeypatch.setenv("SPECDEC_INT4_PATH", "scalar")
    assert torch.equal(pinned(x), RowInt4Linear(linear)(x))
    monkeypatch.setenv("SPECDEC_INT4_PATH", "sse")
    with pytest.raises(ValueError, match="SPECDEC_INT4_PATH='sse': expected one of amx, avx512"):
        RowInt4Linear(linear)


def test_the_environment_holds_the_row_operations_with_the_path(monkeypatch):
    """A process pinned to the AVX2 (scalar) path loads the kernel build whose row
    operations stop at AVX2 (baseline code), so that one variable holds every specdec kernel;
    unpinned or pinned to AVX-512, the usual build; a wrong name leaves the build alone (the
    layers refuse it)."""
    monkeypatch.delenv("SPECDEC_INT4_PATH", raising=False)
    assert kernels.held_build() == ""
    expected = {"avx2": "_avx2", "scalar": "_baseline", "avx512": "", "amx": "", "sse": ""}
    for name, build in expected.items():
        monkeypatch.setenv("SPECDEC_INT4_PATH", name)
        assert kernels.held_build() == build
        assert build in kernels.BUILDS


@pytest.fixture(scope="module")
def int4_pair():
    target = make_int4_batch_invariant(tiny_llama(seed=0))
    draft = make_int4_batch_invariant(perturbed_copy(tiny_llama(seed=0), noise=0.03, seed=1))
    return target, draft


def test_the_tiny_model_runs_its_linears_in_int4(int4_pair):
    kinds = {type(module).__name__ for module in int4_pair[0].modules()}
    assert "RowInt4Linear" in kinds
    assert not any(type(module) is nn.Linear for module in int4_pair[0].modules())


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8])
def test_int4_greedy_speculation_equals_int4_plain(int4_pair, k):
    target, draft = int4_pair
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    for prompt in ([5, 9, 2], [7, 1, 30, 12, 4, 4, 9, 2, 3, 11, 5]):
        expected = Engine(backend(target)).generate(prompt, params)
        out = Engine(backend(target), ModelDrafter(backend(draft))).generate(
            prompt, params, SpecConfig(k=k)
        )
        assert out.token_ids == expected.token_ids
        assert out.stats.accepted_tokens > 0


def test_int4_seeded_sampling_equals_int4_plain_for_every_k(int4_pair):
    """Coupled verification on int4 (the row kernels, the lean layer loop, in-place caches):
    a seeded sampled output is plain int4 decoding's with that seed, whatever k, with top-k
    and top-p shaping both sides."""
    target, draft = int4_pair
    params = SamplingParams(max_tokens=40, temperature=0.9, top_k=12, top_p=0.95, seed=5)
    prompt = [7, 1, 30, 12, 4, 4, 9]
    expected = Engine(backend(target)).generate(prompt, params, SpecConfig(verification="coupled"))
    accepted = 0
    for k in (1, 3, 5, 8, "auto"):
        out = Engine(backend(target), ModelDrafter(backend(draft))).generate(
            prompt, params, SpecConfig(k=k, verification="coupled")
        )
        assert out.token_ids == expected.token_ids, f"k={k}"
        accepted += out.stats.accepted_tokens
    assert accepted > 0
    other = Engine(backend(target)).generate(prompt, dataclasses.replace(params, seed=6))
    assert other.token_ids != expected.token_ids  # the seed matters: the check can fail


@pytest.fixture(scope="module", params=GROUPS, ids=lambda group: f"group{group}")
def real_size_int4_model(request):
    from specdec.doctor import real_size_model

    return make_int4_batch_invariant(real_size_model(), group=request.param)


@pytest.mark.parametrize("count", THREADS)
def test_blocks_equal_steps_at_real_layer_sizes(real_size_int4_model, threads, count):
    """Hidden 1536, intermediate 8960 (the 1.5B's layers), blocks of 2..45 tokens, on every
    vector path of the kernel this CPU has (AMX's tiles in the block of 45), a weight scale
    per 32 inputs and per 128 (a draft's)."""
    from specdec.doctor import check_block_equals_steps

    layers = [m for m in real_size_int4_model.modules() if isinstance(m, RowInt4Linear)]
    try:
        for path in vector_paths():
            for layer in layers:
                layer.path = path
            result = check_block_equals_steps(real_size_int4_model, count)
            assert result.ok, (
                f"path {path}: {result.mismatched} of {result.blocks} blocks differ at "
                f"{count} threads"
            )
    finally:
        for layer in layers:
            layer.path = -1


# ---- the on-disk runtime form ------------------------------------------------------------

IDS = [5, 9, 2, 7, 7, 1, 30, 12]


def test_a_cached_int4_load_is_the_same_model_bit_for_bit(model_dir, tmp_path):
    cache = tmp_path / "cache" / "int8"
    built = load_hf(model_dir, "int4", int8_cache=cache)
    loaded = load_hf(model_dir, "int4", int8_cache=cache)
    (entry,) = [path for path in (tmp_path / "cache" / "int4").iterdir() if path.is_dir()]
    assert (entry / int8_cache.MARKER).is_file()
    assert not cache.exists(), "int4 entries live beside the int8 ones, not among them"
    expected = load_hf(model_dir, "int4").forward(IDS)
    for model in (built, loaded):
        assert torch.equal(model.forward(IDS), expected)
    assert any(isinstance(m, RowInt4Linear) for m in loaded.model.modules())


def test_a_truncated_int4_entry_is_rebuilt(model_dir, tmp_path):
    cache = tmp_path / "cache" / "int8"
    expected = load_hf(model_dir, "int4", int8_cache=cache).forward(IDS)
    (entry,) = [path for path in (tmp_path / "cache" / "int4").iterdir() if path.is_dir()]
    weights = entry / int8_cache.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-100])
    fingerprint = int8_cache.source_fingerprint(model_dir, "int4")
    assert not int8_cache.is_complete(entry, fingerprint)
    assert torch.equal(load_hf(model_dir, "int4", int8_cache=cache).forward(IDS), expected)
    assert int8_cache.is_complete(entry, fingerprint)


def test_an_int8_entry_is_not_taken_for_an_int4_one(model_dir, tmp_path):
    assert int8_cache.source_fingerprint(model_dir, "int8") != int8_cache.source_fingerprint(
        model_dir, "int4"
    )


# ---- where the kernel cannot be built ------------------------------------------------------


def test_a_failed_build_is_one_clear_error(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    def no_compiler(**kwargs):
        raise RuntimeError("Error building extension 'specdec_int4'\ng++: not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setattr(kernels, "kernel_dir", lambda: tmp_path)
    refused = "g\\+\\+: not found.*--target-runtime int8"
    with pytest.raises(kernels.KernelUnavailable, match=refused):
        kernels._build()


def test_a_failed_build_is_tried_once_and_said_once(monkeypatch, tmp_path, capsys):
    """Every int8 model load asks for the kernel (its row operations): where it cannot be
    built, the build is tried once a process and the int8 runtime's fallback said once."""
    from torch.utils import cpp_extension

    builds = []

    def no_compiler(**kwargs):
        builds.append(kwargs["name"])
        raise RuntimeError("Error building extension 'specdec_int4'\ng++: not found")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    monkeypatch.setattr(kernels, "kernel_dir", lambda: tmp_path)
    monkeypatch.setattr(kernels, "_kernel", None)
    monkeypatch.setattr(kernels, "_failed", None)
    assert kernels.kernel_or_none() is None and kernels.kernel_or_none() is None
    with pytest.raises(kernels.KernelUnavailable, match="g\\+\\+: not found"):
        kernels.kernel()
    assert len(builds) == 1
    err = capsys.readouterr().err
    assert err.count("compiling specdec's int4 kernel") == 1, err
    assert err.count("the int8 runtime runs torch's forms here: ") == 1, err


def test_a_build_lock_left_by_a_killed_process_does_not_hang_the_next(monkeypatch, tmp_path):
    """torch's build lock is a plain file: a process killed while loading the kernel leaves
    it, and torch would then wait for it forever. _build clears it under its own OS lock."""
    from torch.utils import cpp_extension

    seen = []

    def load(**kwargs):
        seen.append((Path(kwargs["build_directory"]) / "lock").exists())
        return "kernel"

    monkeypatch.setattr(cpp_extension, "load", load)
    monkeypatch.setattr(kernels, "kernel_dir", lambda: tmp_path)
    leftover = tmp_path / kernels.kernel_name() / "lock"
    leftover.parent.mkdir(parents=True)
    leftover.touch()
    assert kernels._build() == "kernel"
    assert seen == [False]


def test_the_cli_says_so_in_one_line(monkeypatch, tmp_path, capsys):
    from specdec.cli import main

    def unavailable():
        raise kernels.KernelUnavailable("the int4 kernel did not build (no compiler)")

    monkeypatch.setattr(kernels, "kernel", unavailable)
    model_dir = tmp_path / "tiny"
    tiny_llama(seed=0).save_pretrained(model_dir)
    char_tokenizer().save_pretrained(model_dir)
    args = ["generate", "ab", "--target", str(model_dir), "--dtype", "int4"]
    code = main([*args, "--drafter", "lookup", "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert code == 1 and "did not build" in err and "Traceback" not in err


def test_doctor_checks_the_int4_runtime_too(capsys):
    from specdec.cli import main

    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert f"int4 runtime: kernel built, {kernels.PATHS[kernels.best_path()]} path" in out
    assert out.count("8 threads: ok") == 2  # int8 and int4


def test_an_output_layer_quantized_in_pieces_is_the_whole_byte_for_byte(monkeypatch):
    from specdec.backends.quant import int4

    weight = torch.randn(16 * 13, 64, generator=torch.Generator().manual_seed(0))
    whole = int4.pack(*int4.quantize_groups(weight))
    monkeypatch.setattr(int4, "ROWS_AT_ONCE", 16 * 4)  # 13 tiles: pieces of 4, 4, 4, 1
    assert torch.equal(int4.quantize_and_pack(weight), whole)


def test_the_quantizer_gives_the_plain_formulas_codes_scales_and_minimums():
    """quantize_groups works in place for speed; the plain formula is the reference (a
    constant group, scale 0, gets code 0)."""
    weight = torch.randn(64, 96, generator=torch.Generator().manual_seed(2)) * 0.05
    weight[3] = 0.7
    weight[5, :64] = 0.0
    grouped = weight.reshape(64, 3, 32)
    minimum = grouped.amin(-1).half()
    scale = ((grouped.amax(-1) - minimum.float()) / 15).half()
    safe = scale.float().clamp(min=torch.finfo(torch.float16).tiny).unsqueeze(-1)
    codes = ((grouped - minimum.float().unsqueeze(-1)) / safe).round().clamp(0, 15)
    codes = torch.where(scale.unsqueeze(-1) == 0, torch.zeros_like(codes), codes)
    got = int4.quantize_groups(weight)
    assert torch.equal(got[0], codes.to(torch.uint8).reshape(64, 96))
    assert torch.equal(got[1], scale) and torch.equal(got[2], minimum)


# ---- a draft's weights: a scale and minimum per 128 inputs, fitted --------------------------


def test_a_draft_groups_scale_is_fitted_to_no_worse_than_its_range():
    """At 128 inputs a scale, the least-squares fits are kept only where they lower a group's
    squared error: never worse than min and max alone, better in sum; codes stay 0..15 and a
    constant group stays exact."""
    weight = random_linear(64, 512, seed=11).weight.detach()
    weight[7] = 0.25  # a float16 value: exact
    codes, scales, minimums = int4.quantize_groups(weight, int4.DRAFT_GROUP)
    assert scales.shape == (64, 4) and int(codes.max()) <= 15
    grouped = weight.reshape(64, 4, 128)
    low, high = grouped.amin(-1).half(), grouped.amax(-1)
    spans = ((high - low.float()) / 15).half()
    safe = spans.float().clamp(min=torch.finfo(torch.float16).tiny).unsqueeze(-1)
    codes_by_range = ((grouped - low.float().unsqueeze(-1)) / safe).round()  # 0 where constant
    by_range = codes_by_range.clamp(0, 15) * spans.float().unsqueeze(-1) + low.float().unsqueeze(-1)
    fitted = int4.dequantize(codes, scales, minimums).reshape(64, 4, 128)
    range_error = (by_range - grouped).square().sum(-1)
    fitted_error = (fitted - grouped).square().sum(-1)
    assert bool((fitted_error <= range_error).all())
    assert float(fitted_error.sum()) < 0.95 * float(range_error.sum())
    assert torch.equal(fitted[7], grouped[7])


def test_a_draft_group_packs_and_unpacks():
    weight = random_linear(32, 384, seed=12).weight.detach()
    quantized = int4.quantize_groups(weight, int4.DRAFT_GROUP)
    packed = int4.pack(*quantized)
    assert packed.shape == (2, 3, 4 * 256 + 64) and int4.scale_group(packed) == 128
    assert all(torch.equal(a, b) for a, b in zip(int4.unpack(packed), quantized, strict=True))
    with pytest.raises(ValueError, match="32 or 128"):
        int4.quantize_groups(weight, 64)


def wide_model_dir(tmp_path: Path) -> Path:
    """A tiny Llama 128 wide (its linears take 128 or 256 inputs: a draft's groups fit)."""
    directory = tmp_path / "wide"
    tiny_llama(seed=0, hidden=128, intermediate=256).save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return directory


def test_a_draft_form_is_kept_beside_the_models_own(tmp_path):
    """int4_group=128 quantizes every layer's linears with a scale per 128 inputs (the
    output layer per 32) into a runtime form of its own (the 32 one is not touched); loaded
    again it is the same model bit for bit, and speculation with it as the draft equals plain
    decoding."""
    directory = wide_model_dir(tmp_path)
    cache = tmp_path / "cache" / "int8"
    target = load_hf(directory, "int4", int8_cache=cache)
    built = load_hf(directory, "int4", int8_cache=cache, int4_group=int4.DRAFT_GROUP)
    loaded = load_hf(directory, "int4", int8_cache=cache, int4_group=int4.DRAFT_GROUP)
    names = sorted(p.name for p in (tmp_path / "cache" / "int4").iterdir() if p.is_dir())
    assert len(names) == 2 and names[1] == names[0] + "-g128"

    def groups(model) -> set[int]:
        layers = model.model.get_decoder().layers
        return {m.group for m in layers.modules() if isinstance(m, RowInt4Linear)}

    def logits(model) -> torch.Tensor:
        model.truncate(0)
        return model.forward(IDS)

    assert groups(target) == {32} and groups(built) == groups(loaded) == {128}
    assert built.model.get_output_embeddings().group == int4.OUTPUT_GROUP
    assert torch.equal(logits(built), logits(loaded))
    assert not torch.equal(logits(built), logits(target))
    params = SamplingParams(temperature=0.0, max_tokens=24)
    plain = Engine(target).generate(IDS, params, SpecConfig(k=0))
    for k in (1, 3, 5):
        spec = Engine(target, ModelDrafter(loaded)).generate(IDS, params, SpecConfig(k=k))
        assert spec.token_ids == plain.token_ids
