"""ONNX Runtime GenAI as bench peers: Microsoft's on-device inference library (peers extra).

- ``onnx-int4``: the target alone.
- ``onnx-int4-lookup``: its n-gram (prompt lookup) speculation.
- ``onnx-int4-model``: its speculative decoding with the 0.5B draft model.

Both models are converted once by ONNX Runtime GenAI's own model builder
(``python -m onnxruntime_genai.models.builder -p int4 -e cpu``, the MatMulNBits INT4 format its
CPU kernels run) from specdec's cached transformers directories, into
``<cache>/onnx/<name>-int4``; the conversion's time is recorded in the directory's marker and
reported by the bench. Its draft-model mode is configured in ``genai_config.json``
(``model.draft``, ``speculative.max_draft_tokens``), so the pair gets a directory of its own
whose config points at both models. Acceptance comes from its own speculative statistics.
Identity is judged against ``onnx-int4`` (its numerics are not ours).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from specdec.config import SamplingParams
from specdec.metrics import SpecStats

LOOKUP_TOKENS = 5  # as openvino-lookup
NGRAM_SIZE = 3
DRAFT_TOKENS = 4  # as openvino-int4-model
FORMAT = 1
MARKER = ".specdec-onnx-complete"
SYSTEMS = {
    "onnx-int4": "ONNX Runtime GenAI, target alone, INT4 (its model builder)",
    "onnx-int4-lookup": (
        f"ONNX Runtime GenAI n-gram speculation ({LOOKUP_TOKENS} tokens, {NGRAM_SIZE}-grams), INT4"
    ),
    "onnx-int4-model": (
        f"ONNX Runtime GenAI with the 0.5B draft ({DRAFT_TOKENS} tokens a round), INT4"
    ),
}
OWN_PLAIN = {"onnx-int4-lookup": "onnx-int4", "onnx-int4-model": "onnx-int4"}


class OnnxGenAISystem:
    """One ``og.Model``, made on the first run. ``model_dir(role)`` gives the converted
    directory of "target", or of "pair" (the target with the draft in its config)."""

    def __init__(self, name: str, model_dir):
        self.name, self.model_dir = name, model_dir
        self.lookup = name == "onnx-int4-lookup"
        self.with_draft = name == "onnx-int4-model"
        self._model: Any = None
        self.setup_note = ""

    @property
    def needs(self) -> set[tuple[str, str]]:
        return set()  # nothing from the pool: it runs its own converted models

    def run(self, prompt_ids: list[int], params: SamplingParams):
        import numpy as np
        import onnxruntime_genai as og

        from specdec.bench.output import RunOutput

        model = self._load()
        generator_params = og.GeneratorParams(model)
        search: dict[str, Any] = {
            "max_length": len(prompt_ids) + params.max_tokens,
            "do_sample": not params.greedy,
        }
        if not params.greedy:
            search |= {"temperature": params.temperature, "top_p": params.top_p}
            search["top_k"] = params.top_k or 0
            if params.seed is not None:
                search["random_seed"] = params.seed % 2**31
        generator_params.set_search_options(**search)
        if self.lookup:
            generator_params.set_speculative_options(
                ngram_size=NGRAM_SIZE, max_draft_tokens=LOOKUP_TOKENS
            )
        started = time.perf_counter()
        generator = og.Generator(model, generator_params)
        generator.append_tokens(np.array(prompt_ids, dtype=np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        sequence = generator.get_sequence(0)
        seconds = time.perf_counter() - started
        tokens = [int(t) for t in sequence[len(prompt_ids) :]][: params.max_tokens]
        stats = self._stats(generator) if (self.lookup or self.with_draft) else None
        return RunOutput(tokens, seconds, stats, peer=True)

    @staticmethod
    def _stats(generator) -> dict:
        """Its own counters as SpecStats (rounds = its speculative rounds)."""
        own = generator.get_speculative_stats()
        stats = SpecStats(
            rounds=int(own["rounds"]),
            drafted_tokens=int(own["draft_tokens_evaluated"]),
            accepted_tokens=int(own["draft_tokens_accepted"]),
            bonus_tokens=int(own["bonus_tokens"]),
            target_forwards=int(own["target_forward_passes"]),
        )
        return stats.to_dict()

    def _load(self):
        if self._model is None:
            try:
                import onnxruntime_genai as og
            except ImportError:
                raise ValueError(
                    f"system {self.name!r} needs ONNX Runtime GenAI: pip install -e '.[peers]'"
                ) from None
            path, note = self.model_dir("pair" if self.with_draft else "target")
            started = time.perf_counter()
            try:
                self._model = og.Model(str(path))
            except RuntimeError as error:  # its own message, one line
                message = f"{self.name}: ONNX Runtime GenAI cannot load {path}: {error}"
                raise ValueError(message) from None
            self.setup_note = f"{note}; loaded in {time.perf_counter() - started:.1f} s"
        return self._model


def converted_dir(cache_root: Path, name: str, hf_dir: Path, progress=None) -> tuple[Path, str]:
    """``<cache>/onnx/<name>-int4``, converted once from ``hf_dir`` by ONNX Runtime GenAI's
    model builder; with a note of the conversion's time."""
    out = cache_root / "onnx" / f"{name}-int4"
    expected = {"format": FORMAT, "source": str(hf_dir)}
    marker = _read_marker(out, expected)
    if marker is not None and _damaged(out, marker):
        marker = None
    if marker is None:
        _build(hf_dir, out, expected, name, progress)
        marker = _read_marker(out, expected)
        if marker is None:
            raise ValueError(f"{out}: the conversion finished but its files do not check out")
    return out, f"converted once in {marker['convert_seconds']:.0f} s, cached"


def pair_dir(cache_root: Path, target: Path, draft: Path, draft_tokens: int = DRAFT_TOKENS) -> Path:
    """A directory whose ``genai_config.json`` runs ``target`` with ``draft`` as its draft
    model (both converted). ONNX Runtime GenAI takes model files only from under the config's
    directory, so the models are linked in: the target's files beside the config, the
    draft's under ``draft/`` (each model finds its external data next to itself)."""
    out = cache_root / "onnx" / f"{target.name}-with-{draft.name}"
    config = json.loads((target / "genai_config.json").read_text())
    decoder = json.loads((draft / "genai_config.json").read_text())["model"]["decoder"]
    config["model"]["draft"] = decoder | {"filename": f"draft/{decoder['filename']}"}
    config["speculative"] = {"max_draft_tokens": draft_tokens}
    shutil.rmtree(out, ignore_errors=True)
    (out / "draft").mkdir(parents=True)
    for source, into in ((target, out), (draft, out / "draft")):
        for path in source.iterdir():
            if path.name.startswith("model.onnx"):
                (into / path.name).symlink_to(path)
            elif path.name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
                shutil.copyfile(path, into / path.name)
    (out / "genai_config.json").write_text(json.dumps(config, indent=2))
    return out


def _build(hf_dir: Path, out: Path, expected: dict, name: str, progress) -> None:
    try:
        import onnx_ir  # noqa: F401  # the builder's own dependency, checked before it runs
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        raise ValueError(
            "the onnx-int4 systems convert the models with ONNX Runtime GenAI's model builder: "
            "pip install -e '.[peers]'"
        ) from None
    if not (hf_dir / "config.json").is_file():
        raise ValueError(f"{hf_dir} has no transformers model to convert")
    building = out.with_name(out.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    label = f"converting {name} to ONNX INT4 (once)"
    if progress:
        progress(label, 0, 1)
    started = time.perf_counter()
    log = out.with_name(out.name + ".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as handle:
        done = subprocess.run(
            [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir)]
            + ["-o", str(building), "-p", "int4", "-e", "cpu"]
            + ["-c", str(building.with_name(building.name + "-cache"))],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=os.environ | {"TQDM_DISABLE": "1"},
        )
    shutil.rmtree(building.with_name(building.name + "-cache"), ignore_errors=True)
    if done.returncode != 0 or not (building / "genai_config.json").is_file():
        raise ValueError(f"converting {name} with ONNX Runtime GenAI's builder failed: see {log}")
    from specdec.integrity import write_marker

    seconds = time.perf_counter() - started
    write_marker(building, MARKER, expected | {"convert_seconds": round(seconds, 1)})
    shutil.rmtree(out, ignore_errors=True)
    building.replace(out)
    if progress:
        progress(label, 1, 1)


def _damaged(directory: Path, marker: dict) -> bool:
    from specdec.integrity import damaged_files, say_rebuilding

    bad = damaged_files(directory, marker)
    if bad:
        say_rebuilding(directory / bad[0], "converting it again")
    return bool(bad)


def _read_marker(directory: Path, expected: dict) -> dict | None:
    from specdec.integrity import read_marker

    return read_marker(directory, MARKER, expected)
