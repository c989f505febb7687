"""A step's memory floor: the bytes a step reads, counted by hand on small models, and the
doctor's lines for real runtimes of a model directory."""

from __future__ import annotations

import re

from torch import nn

from specdec import floor
from specdec.backends.quant.int4 import RowInt4Linear
from specdec.backends.quant.int8 import RowInt8Linear


class Tiny(nn.Module):
    def __init__(self, head: nn.Module, tied: bool = False):
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.norm = nn.LayerNorm(32)  # weight and bias: 2 x 32 floats
        self.head = head
        if tied:
            self.head.weight = self.embed.weight


def test_a_step_reads_each_weight_in_its_stored_form_and_one_embedding_row():
    int4 = RowInt4Linear(nn.Linear(32, 48))
    assert floor.step_bytes(Tiny(int4)) == (
        32 * 4  # one embedding row, float32
        + 2 * 32 * 4  # the norm
        + 3 * 1 * 320  # 48 / 16 tiles x 32 / 32 groups, 320 bytes a block
        + 48 * 4  # the bias
    )
    int8 = RowInt8Linear(nn.Linear(32, 48, bias=False))
    assert floor.step_bytes(Tiny(int8)) == 32 * 4 + 2 * 32 * 4 + 48 * (32 + 2 + 4)


def test_a_tied_output_layer_reads_the_whole_table_once():
    """The output layer of a tied model reads all of the embedding table; the input
    embedding's row is counted besides it (the same table, read again for one row)."""
    tied = Tiny(nn.Linear(32, 100, bias=False), tied=True)
    assert floor.step_bytes(tied) == 32 * 4 + 2 * 32 * 4 + 100 * 32 * 4
    untied = Tiny(nn.Linear(32, 100, bias=False))
    assert floor.step_bytes(untied) == floor.step_bytes(tied)  # another table, the same bytes
    twice = Tiny(nn.Linear(32, 100, bias=False))
    twice.other = twice.head  # one module reachable twice: its weight counts once
    assert floor.step_bytes(twice) == floor.step_bytes(tied)


def test_the_floor_is_the_bytes_over_the_read_speed():
    measured = floor.Floor(step_bytes=10**9, step_ms=50.0, bandwidth=25e9)
    assert measured.floor_ms == 40.0 and measured.times_floor == 1.25
    assert measured.line() == "1.00 GB a step, 50.0 ms: its floor 40.0 ms, 1.25x the floor"
    with_fastest = floor.Floor(step_bytes=10**9, step_ms=50.0, bandwidth=25e9, fastest_ms=44.0)
    assert with_fastest.line() == (
        "1.00 GB a step, 50.0 ms: its floor 40.0 ms, 1.25x the floor (the fastest 44.0 ms, 1.10x)"
    )
    assert floor.size(2_500_000) == "2.50 MB" and floor.size(10**8) == "0.10 GB"


def test_the_read_speed_is_measured_over_the_buffer():
    """A sum over 64 MiB, timed: a finite rate, and more than one sum's worth of bytes can
    not have been read faster than the clock allows (well over 1 MB/s on any machine)."""
    rate = floor.read_bandwidth(size=1 << 26, repeats=2)
    assert 1e6 < rate < float("inf")


def test_doctor_times_each_runtime_of_a_model_against_its_floor(model_dir, tmp_path, capsys):
    from specdec.cli.tools import memory_floor
    from specdec.loading import load_backend

    cache = str(tmp_path / "cache")
    memory_floor(cache, models=(str(model_dir),))
    out = capsys.readouterr().out
    assert re.search(r"memory: reads [\d.]+ GB/s", out)
    for runtime in ("int4", "int8"):
        bytes_read = floor.step_bytes(load_backend(str(model_dir), runtime, cache).model)
        line = next(line for line in out.splitlines() if "x the floor" in line and runtime in line)
        assert f"{floor.size(bytes_read)} a step" in line and "MB" in line, line
        median, fastest = (float(v) for v in re.findall(r"([\d.]+) ms[:,]", line)[::2])
        assert 0 < fastest <= median, line


def test_doctor_times_the_draft_as_it_drafts_too(model_dir, tmp_path, monkeypatch, capsys):
    """A draft that --draft-vocab auto trims is timed twice: whole, and scoring the shipped
    vocabulary (fewer bytes a step). The tiny model stands in for the catalog's draft."""
    from specdec import runtime, vocab
    from specdec.cli.tools import memory_floor

    subset = tmp_path / "subset.json"
    vocab.save(subset, list(range(0, 32, 2)), "tiny", 32, {})
    monkeypatch.setattr(
        runtime, "draft_vocabulary", lambda draft, choice, on: str(subset) if choice else None
    )
    monkeypatch.setattr("specdec.cli.tools.draft_vocabulary", runtime.draft_vocabulary)
    from specdec.loading import load_backend

    name, cache = str(model_dir), str(tmp_path / "cache")
    memory_floor(cache, models=(name,), drafts=(name,))
    lines = capsys.readouterr().out.splitlines()
    for on in ("int4", "int8"):
        whole = floor.step_bytes(load_backend(name, on, cache).model)
        draft, _ = runtime.load_draft(name, on, cache)  # as generate loads it
        trimmed = floor.step_bytes(draft.model)
        assert trimmed < whole
        line = next(line for line in lines if f"{name} on {on} as a draft (16 tokens" in line)
        assert f"{floor.size(trimmed)} a step" in line, line
    memory_floor(cache, models=(name,), drafts=())
    assert "as a draft" not in capsys.readouterr().out
