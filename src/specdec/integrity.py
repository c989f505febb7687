"""Cache entries that cannot silently go wrong: markers, checksums, locks.

A cache entry is a directory whose marker, written last, records its fields (format,
source) and each file's size and XXH3-128 digest; a single cached file (a GGUF) gets a
stamp beside it with the same two facts. Sizes tell an interrupted write; the digest tells
a file damaged in place (a flipped byte keeps the size). XXH3 guards against damage, not
tampering (the GGUF assembled from PyPI parts is checked against the catalog's sha256 for
that); it is used for its speed, about ten times sha256's, so that every load can afford
to check every byte.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import xxhash

ALGORITHM = "xxh3_128"
_BLOCK = 1 << 26  # 64 MiB between progress reports

Progress = Callable[[str, int, int], None]  # (step description, done, total)


def file_digest(path: Path, progress: Progress | None = None) -> str:
    """The XXH3-128 digest of every byte of ``path``, read through maps of 64 MiB at a time:
    no copy (twice the speed of reads into a buffer), and at most one window's pages in the
    resident set (a whole-file map would count a 2 GB file's pages while it is hashed)."""
    digest = xxhash.xxh3_128()
    size = path.stat().st_size
    with open(path, "rb") as handle:
        for start in range(0, size, _BLOCK):
            length = min(_BLOCK, size - start)
            with mmap.mmap(handle.fileno(), length, prot=mmap.PROT_READ, offset=start) as window:
                digest.update(window)
            if progress is not None and size > _BLOCK:  # small files: no report
                progress(f"checking {path.name}", start + length, size)
    return digest.hexdigest()


def digests(directory: Path, names: list[str]) -> dict[str, str]:
    """The digest of each named file in ``directory``."""
    return {name: file_digest(directory / name) for name in names}


def damaged(
    directory: Path, expected: dict[str, str], progress: Progress | None = None
) -> list[str]:
    """The files of ``directory`` whose digest is not the ``expected`` one (a missing file
    counts as damaged), in name order."""
    bad = []
    for name in sorted(expected):
        path = directory / name
        if not path.is_file() or file_digest(path, progress) != expected[name]:
            bad.append(name)
    return bad


def write_marker(directory: Path, name: str, fields: dict) -> None:
    """Written last into a cache entry: ``fields``, and the size and digest of every file
    beside it."""
    names = [f.name for f in sorted(directory.iterdir()) if f.is_file() and f.name != name]
    files = {n: (directory / n).stat().st_size for n in names}
    record = fields | {"files": files, ALGORITHM: digests(directory, names)}
    _write_atomically(directory / name, json.dumps(record, indent=1))


def read_marker(directory: Path, name: str, expected: dict) -> dict | None:
    """The marker of a finished entry whose ``expected`` fields match, whose files are all
    there in their recorded sizes and that records their digests; None for anything else
    (missing, stale, truncated, or written before digests were). Digests are checked by
    ``damaged_files``, where the bytes are about to be read."""
    try:
        marker = json.loads((directory / name).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or any(marker.get(k) != v for k, v in expected.items()):
        return None
    files, recorded = marker.get("files"), marker.get(ALGORITHM)
    if not isinstance(files, dict) or not isinstance(recorded, dict) or set(files) != set(recorded):
        return None
    for file_name, size in files.items():
        path = directory / file_name
        if not path.is_file() or path.stat().st_size != size:
            return None
    return marker


def damaged_files(
    directory: Path, marker: dict, names: list[str] | None = None, progress: Progress | None = None
) -> list[str]:
    """The files of a marked entry (all, or ``names``) whose bytes are not what the marker
    recorded."""
    recorded = marker[ALGORITHM]
    wanted = recorded if names is None else {n: recorded[n] for n in names if n in recorded}
    return damaged(directory, wanted, progress)


def stamp(path: Path) -> None:
    """Record a single cached file's size and digest beside it (``<path>.check.json``)."""
    record = {"size": path.stat().st_size, ALGORITHM: file_digest(path)}
    _write_atomically(_stamp_path(path), json.dumps(record))


def stamped_intact(path: Path, progress: Progress | None = None) -> bool | None:
    """Whether ``path`` is what its stamp recorded; None when it has no (readable) stamp."""
    try:
        record = json.loads(_stamp_path(path).read_text())
        size, digest = int(record["size"]), str(record[ALGORITHM])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not path.is_file() or path.stat().st_size != size:
        return False
    return file_digest(path, progress) == digest


def remove_stamped(path: Path) -> None:
    """Remove a stamped file and its stamp (nothing when neither is there)."""
    path.unlink(missing_ok=True)
    _stamp_path(path).unlink(missing_ok=True)


def say_rebuilding(path: Path, what: str) -> None:
    """The one line a damaged cache file gets before it is rebuilt."""
    sys.stderr.write(f"specdec: {path} is damaged (its checksum does not match): {what}\n")


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".check.json")


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    os.replace(partial, path)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (two builds of one cache entry wait)."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
