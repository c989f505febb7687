"""Trained heads in the model cache, one entry per target.

Each save is a new version directory, ``<entry>/<kind>.v<N>``: the weights (safetensors),
the config and a marker with every file's size and digest, written under a temporary name
and renamed into place in one step; older versions are removed only after. So there is
never a moment without a complete set, and a crash leaves the last complete one in use.
Saves of one entry take a lock; a load checks every byte against the marker and refuses
damaged heads with one line (they cannot be rebuilt without training again). Heads saved
by specdec before versions (``<entry>/<kind>/heads.pt``) still load, and are saved again
in this form on their first load.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from specdec.integrity import damaged_files, file_lock, read_marker, write_marker
from specdec.models import cache_root

MARKER = "heads-ok.json"
FORMAT = "specdec-heads/2"  # 2: safetensors weights, versioned directories, digests
WEIGHTS = "heads.safetensors"
_LEGACY_FORMAT, _LEGACY_WEIGHTS = "specdec-heads/1", "heads.pt"
_VERSION = re.compile(r"^(?P<kind>[a-z]+)\.v(?P<n>[0-9]+)$")


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


def current(entry: Path, kind: str) -> Path | None:
    """The directory of the newest complete heads of ``kind`` in ``entry`` (a legacy
    ``<kind>/`` one if there is no version), or None."""
    versions = sorted(
        (int(m["n"]), path)
        for path in (entry.iterdir() if entry.is_dir() else [])
        if (m := _VERSION.match(path.name)) and m["kind"] == kind
    )
    for _, path in reversed(versions):
        if read_marker(path, MARKER, {"format": FORMAT, "kind": kind}) is not None:
            return path
    legacy = entry / kind
    return legacy if legacy.is_dir() else (versions[-1][1] if versions else None)


def save(entry: Path, kind: str, config: dict, state: dict[str, torch.Tensor]) -> Path:
    """Write heads of ``kind`` as a new version; returns its directory."""
    from safetensors.torch import save_file

    entry.mkdir(parents=True, exist_ok=True)
    tmp = entry / f".{kind}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({name: t.detach().contiguous() for name, t in state.items()}, tmp / WEIGHTS)
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    write_marker(tmp, MARKER, {"format": FORMAT, "kind": kind, "target": config["fingerprint"]})
    with file_lock(entry / f".{kind}.save.lock"):
        final = entry / f"{kind}.v{_next_version(entry, kind)}"
        os.replace(tmp, final)  # the one step that makes the new heads the current ones
        for path in entry.iterdir():  # older versions, and the legacy directory
            m = _VERSION.match(path.name)
            if path != final and ((m and m["kind"] == kind) or path.name == kind):
                shutil.rmtree(path, ignore_errors=True)
    # Evaluations of the heads just replaced describe heads that no longer exist.
    for path, (evaluated, _) in _eval_files(entry):
        if evaluated == kind:
            path.unlink(missing_ok=True)
    return final


def _next_version(entry: Path, kind: str) -> int:
    numbers = [
        int(m["n"]) for p in entry.iterdir() if (m := _VERSION.match(p.name)) and m["kind"] == kind
    ]
    return max(numbers, default=0) + 1


@contextlib.contextmanager
def training(entry: Path, kind: str) -> Iterator[None]:
    """Held while heads of ``kind`` train for this entry: a second trainer is refused at
    once (one line) instead of training beside the first over the same checkpoint."""
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry / f".{kind}.train.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(
                f"another 'specdec heads train --kind {kind}' is training heads for this target "
                f"({entry}): wait for it to finish"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load(entry: Path, kind: str, fingerprint: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, weights) of the heads of ``kind`` for the target with ``fingerprint``,
    every byte checked; ValueError (one line, with the next step) otherwise."""
    directory = current(entry, kind)
    if directory is None:
        raise ValueError(
            f"no {kind} heads trained for this target (run 'specdec heads data' then "
            f"'specdec heads train --kind {kind}')"
        )
    if (directory / _LEGACY_WEIGHTS).exists() or directory.name == kind:
        config, state = _load_legacy(directory, kind, fingerprint)
        save(entry, kind, config, state)  # in the checked form from now on
        return config, state
    marker = read_marker(directory, MARKER, {"format": FORMAT, "kind": kind})
    if marker is None:
        raise ValueError(f"{directory}: incomplete or corrupt heads; train them again")
    _check_target(directory, marker, fingerprint)
    bad = damaged_files(directory, marker)
    if bad:
        raise ValueError(
            f"{directory / bad[0]} is damaged (its checksum does not match): these heads "
            "cannot be used; train them again"
        )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        config = json.loads((directory / "config.json").read_text())
        state = load_file(directory / WEIGHTS)
    except (OSError, ValueError, SafetensorError) as error:
        raise ValueError(f"{directory}: unreadable heads ({error}); train them again") from None
    return config, state


def _check_target(directory: Path, marker: dict, fingerprint: str) -> None:
    if marker.get("target") != fingerprint:
        raise ValueError(
            f"{directory}: these heads were trained for another target "
            f"({marker.get('target')}, this one is {fingerprint}); train heads for this one"
        )


def _load_legacy(directory: Path, kind: str, fingerprint: str) -> tuple[dict, dict]:
    """Heads saved before versions: sizes recorded, no digests; a pickle, read with
    ``weights_only`` (no code runs), any failure to read it refused."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        marker = None
    files = marker.get("files") if isinstance(marker, dict) else None
    intact = (
        isinstance(files, dict)
        and marker.get("format") == _LEGACY_FORMAT
        and marker.get("kind") == kind
        and all(
            (directory / name).is_file() and (directory / name).stat().st_size == size
            for name, size in files.items()
        )
    )
    if not intact:
        raise ValueError(f"{directory}: incomplete or corrupt heads; train them again")
    assert isinstance(marker, dict), "checked above"
    _check_target(directory, marker, fingerprint)
    try:
        config = json.loads((directory / "config.json").read_text())
        state = torch.load(directory / _LEGACY_WEIGHTS, weights_only=True)
    except Exception as error:  # a damaged pickle raises whatever its bytes lead to
        raise ValueError(f"{directory}: unreadable heads ({error}); train them again") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ValueError(f"{directory}: unreadable heads (not a dict of tensors); train them again")
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
            directory = current(entry, kind)
            if directory is None:
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
    summary = (
        f"; held out, {runtime} target: acceptance by position "
        f"{result.get('acceptance_by_position')}, "
        f"c = {result.get('c_per_draft')}, predicted speedup {result.get('predicted_speedup')}x"
    )
    unseen = result.get("unseen_prompts")
    if unseen:  # what --drafter auto compares
        summary += (
            f"; on replies to unseen prompts: acceptance by position "
            f"{unseen.get('acceptance_by_position')}, predicted speedup "
            f"{unseen.get('predicted_speedup')}x"
        )
    return summary
