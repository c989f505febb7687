"""Progress of long steps (assembling, converting, quantizing, training) on stderr, for every
face (the CLI, ``heads``, ``bench``): the callback is ``models.Progress``, (step, done, total)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


@contextlib.contextmanager
def progress_bar() -> Iterator:
    """A ``models.Progress`` callback drawing rich bars on stderr, one per step; when stderr
    is not a terminal (a log file), a plain line at every tenth of each step instead. Either
    shows the time since the step began."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield progress_lines()
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bars:
        tasks: dict[str, tuple[TaskID, int, int]] = {}  # step: (bar, done, total) last shown

        def update(step: str, done: int, total: int) -> None:
            if step not in tasks or _again(tasks[step][1:], done, total):
                bar = bars.add_task(step, total=total)
            else:
                bar = tasks[step][0]
            bars.update(bar, completed=done, total=total)
            tasks[step] = (bar, done, total)

        yield update


def _again(last: tuple[int, int], done: int, total: int) -> bool:
    """A step reported again from its start (the same training in a later phase of
    ``heads make``): its count went back or its total changed. It gets a new bar or lines,
    timed from then."""
    return done < last[0] or total != last[1]


def progress_lines():
    import time

    steps: dict[str, tuple[float, int, int, int]] = {}  # step: (started, done, total, tenth)

    def update(step: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if step not in steps or _again(steps[step][1:3], done, total):
            steps[step] = (now, done, total, -1)
        started, _, _, shown = steps[step]
        tenth = 10 * done // total if total else 10
        steps[step] = (started, done, total, max(shown, tenth))
        if shown < tenth:
            sys.stderr.write(f"{step}: {done}/{total} ({now - started:.0f} s)\n")
            sys.stderr.flush()

    return update
