"""Trained heads in the model cache, one entry per target, written like the model cache:
into a temporary directory, a marker (with every file's size) last, then renamed into place.
A truncated or foreign entry is detected and never used."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch

from specdec.models import cache_root, read_marker, write_marker

MARKER = "heads-ok.json"
FORMAT = "specdec-heads/1"
WEIGHTS = "heads.pt"


def entry_dir(cache_dir: str | None, fingerprint: str, target_name: str) -> Path:
    """``<cache>/heads/<target name>-<fingerprint>``: data and heads of one target. An
    entry with the same fingerprint under another name (the target given as a directory
    once, as a catalog name another time) is the same target's, and is used."""
    root = cache_root(cache_dir) / "heads"
    existing = sorted(root.glob(f"*-{fingerprint}")) if root.is_dir() else []
    if existing:
        return existing[0]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(target_name).name)[:60] or "target"
    return root / f"{name}-{fingerprint}"


def save(entry: Path, kind: str, config: dict, state: dict[str, torch.Tensor]) -> Path:
    """Write heads of ``kind`` atomically; returns their directory."""
    final = entry / kind
    tmp = entry / f".{kind}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / WEIGHTS)
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    write_marker(tmp, MARKER, {"format": FORMAT, "kind": kind, "target": config["fingerprint"]})
    old = entry / f".{kind}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    # Evaluations of the heads just replaced describe heads that no longer exist.
    for path, (evaluated, _) in _eval_files(entry):
        if evaluated == kind:
            path.unlink(missing_ok=True)
    return final


def load(entry: Path, kind: str, fingerprint: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, weights) of the heads of ``kind`` for the target with ``fingerprint``."""
    directory = entry / kind
    if not directory.exists():
        raise ValueError(
            f"no {kind} heads trained for this target (run 'specdec heads data' then "
            f"'specdec heads train --kind {kind}')"
        )
    marker = read_marker(directory, MARKER, {"format": FORMAT, "kind": kind})
    if marker is None:
        raise ValueError(f"{directory}: incomplete or corrupt heads; train them again")
    if marker.get("target") != fingerprint:
        raise ValueError(
            f"{directory}: these heads were trained for another target "
            f"({marker.get('target')}, this one is {fingerprint}); train heads for this one"
        )
    try:
        config = json.loads((directory / "config.json").read_text())
        state = torch.load(directory / WEIGHTS, weights_only=True)
    except (OSError, ValueError, RuntimeError, EOFError) as error:
        raise ValueError(f"{directory}: unreadable heads ({error}); train them again") from None
    return config, state


def save_eval(entry: Path, kind: str, result: dict, runtime: str = "int8") -> None:
    """Record ``specdec heads eval``'s result for a drafter kind (medusa, eagle, model) made
    with a ``runtime`` target: ``eval/KIND.json`` for int8 (the first runtime heads were
    evaluated with), ``eval/KIND@RUNTIME.json`` otherwise."""
    directory = entry / "eval"
    directory.mkdir(parents=True, exist_ok=True)
    name = kind if runtime == "int8" else f"{kind}@{runtime}"
    tmp = directory / f"{name}.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, directory / f"{name}.json")


def read_evals(entry: Path) -> dict[tuple[str, str], dict]:
    """Every recorded evaluation of the entry, by (drafter kind, target runtime)."""
    results = {}
    for path, key in _eval_files(entry):
        try:
            results[key] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return results


def _eval_files(entry: Path) -> list[tuple[Path, tuple[str, str]]]:
    """The entry's evaluation files with their (drafter kind, target runtime), as
    ``save_eval`` names them."""
    directory = entry / "eval"
    paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
    return [(path, _eval_key(path.stem)) for path in paths]


def _eval_key(stem: str) -> tuple[str, str]:
    kind, _, runtime = stem.partition("@")
    return kind, runtime or "int8"


def list_entries(cache_dir: str | None) -> list[str]:
    """One line per trained heads entry in the cache."""
    root = cache_root(cache_dir) / "heads"
    rows = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        evals = read_evals(entry)
        for kind in ("medusa", "eagle"):
            directory = entry / kind
            marker = read_marker(directory, MARKER, {"format": FORMAT, "kind": kind})
            if marker is None:
                continue
            try:
                config = json.loads((directory / "config.json").read_text())
            except (OSError, ValueError):
                continue
            trained = config.get("training", {})
            rows.append(
                f"{entry.name}: {kind}, {config.get('vocab_count')} tokens scored, "
                f"{trained.get('tokens_seen', '?')} tokens seen in "
                f"{trained.get('minutes', 0):.1f} min"
                + (f" ({trained['precision']})" if "precision" in trained else "")
                + (f", unroll {trained['unroll']}" if trained.get("unroll", 1) > 1 else "")
                + "".join(
                    _eval_summary(result, runtime)
                    for (evaluated, runtime), result in sorted(evals.items())
                    if evaluated == kind
                )
            )
    return rows


def _eval_summary(result: dict, runtime: str) -> str:
    return (
        f"; held out, {runtime} target: acceptance by position "
        f"{result.get('acceptance_by_position')}, "
        f"c = {result.get('c_per_draft')}, predicted speedup {result.get('predicted_speedup')}x"
    )
