"""One progress bar for long work (tracing, steering, evaluations), and the
consoles every command prints with.

The house rule: results (tables, JSON, "wrote ...") go to stdout; progress bars,
spinners, notes and hints go to stderr. When the stream is not a terminal (a
pipe, a file, a CI log), rich would cut tables at 80 columns: :func:`console`
then gives them all the width they need.
"""

from __future__ import annotations

import contextvars
from typing import Any, TypeVar

#: Width of a console that is not a terminal: wide enough never to cut a table.
PIPE_WIDTH = 1000


def console(*, stderr: bool = False) -> Any:
    """A rich Console on stdout (results) or stderr (progress, notes).

    In a terminal it wraps at the terminal's width; elsewhere tables and lines
    are printed whole (width :data:`PIPE_WIDTH`), never cut at 80 columns.
    """
    from rich.console import Console

    terminal = Console(stderr=stderr)
    if terminal.is_terminal:
        return terminal
    return Console(stderr=stderr, width=PIPE_WIDTH, soft_wrap=True)


_L = TypeVar("_L", bound="_Live")


class _Live:
    """A rich display drawn while the ``with`` block runs (none when disabled)."""

    _progress: Any = None

    def __enter__(self: _L) -> _L:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> bool:
        if self._progress is not None:
            self._progress.stop()
        return False


class ProgressBar(_Live):
    """A rich progress bar used as a context manager; a no-op when disabled.

    Example:
        >>> with ProgressBar("tracing smollm2", total=25, unit="prompts") as bar:
        ...     bar.advance(8)
    """

    def __init__(
        self,
        label: str,
        total: float | None,
        *,
        enabled: bool = True,
        completed: float = 0,
        unit: str = "",
        counter: str | None = None,
        transient: bool = False,
    ):
        """``total`` may be ``None`` (unknown yet: see :meth:`update`). The bar is
        drawn on stderr. ``counter`` replaces the ``done/total`` count, e.g.
        ``"t = {task.completed:.3g} / {task.total:.3g}"`` for a bar over time;
        ``transient`` removes the bar when it stops."""
        self.enabled = enabled
        self._progress: Any = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn(counter) if counter else MofNCompleteColumn(),
            TextColumn(unit),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=transient,
            console=console(stderr=True),
        )
        self._task = self._progress.add_task(label, total=total, completed=completed)

    def advance(self, n: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def update(
        self,
        *,
        total: float | None = None,
        completed: float | None = None,
        label: str | None = None,
    ) -> None:
        """Set the total, the amount done and/or the label shown before the bar."""
        if self._progress is None:
            return
        changes: dict[str, Any] = {}
        if total is not None:
            changes["total"] = total
        if completed is not None:
            changes["completed"] = completed
        if label is not None:
            changes["description"] = label
        self._progress.update(self._task, **changes)


class TaskLines(_Live):
    """One progress line per named task (a suite's items), drawn on stderr.

    Each line shows a spinner while its task runs, then its result (e.g.
    ``PASS``/``FAIL``) and the task's elapsed time; lines not started yet read
    ``waiting``. A no-op when disabled.

    Example:
        >>> with TaskLines(["equiangular", "phase-diagram"], title="conformance") as lines:
        ...     lines.start("equiangular")
        ...     lines.finish("equiangular", "PASS")
    """

    def __init__(self, names: list[str], *, title: str = "", enabled: bool = True):
        self.enabled = enabled
        self._progress: Any = None
        self._title = f"{title}: " if title else ""
        self._lines: Any = None
        if not enabled:
            return
        err = console(stderr=True)
        if not err.is_terminal:
            # a pipe or a CI log: no live display (it would print only at the end);
            # one plain line as each task ends instead
            self._lines = err
            return
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(finished_text=" "),
            TextColumn(f"{self._title}[bold]{{task.description}}"),
            BarColumn(bar_width=12),
            TextColumn("{task.fields[state]}"),
            TimeElapsedColumn(),
            console=err,
        )
        self._tasks = {
            name: self._progress.add_task(name, total=1, start=False, state="waiting")
            for name in names
        }

    def start(self, name: str) -> None:
        if self._progress is not None:
            self._progress.start_task(self._tasks[name])
            self._progress.update(self._tasks[name], state="running")

    def finish(self, name: str, state: str) -> None:
        if self._lines is not None:
            self._lines.print(f"{self._title}[bold]{name}[/bold] {state}")
        if self._progress is not None:
            self._progress.update(self._tasks[name], completed=1, state=state)
            self._progress.stop_task(self._tasks[name])


def plural(count: int, word: str, many: str | None = None) -> str:
    """``"1 item"``, ``"3 items"``; ``many`` for an irregular plural."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


class Stages:
    """Progress for work done in named stages (``analyze``, ``report``,
    ``metastability``): one line on stderr with the stage running now, a count of
    stages done and the time elapsed.

    The library reports a stage by calling :func:`stage`, which does nothing
    unless a ``Stages`` is active (the command line opens one); so library calls
    stay silent. The line is drawn only on a terminal and removed when the work
    ends (the command then prints its own "wrote ..."), so it never adds to an
    error's one line or to the output of a pipe. ``seen`` lists the stages
    reported, in order.

    Example:
        >>> with Stages("analysing runs/x"):
        ...     stage("figures")
    """

    def __init__(self, label: str, total: int | None = None, *, enabled: bool | None = None):
        self.label = label
        self.seen: list[str] = []
        if enabled is None:
            enabled = console(stderr=True).is_terminal
        counter = "{task.completed:.0f}" + ("/{task.total:.0f}" if total else "")
        self._bar = ProgressBar(
            label, total, enabled=enabled, unit="steps", counter=counter, transient=True
        )
        self._token: Any = None

    def __enter__(self) -> Stages:
        self._bar.__enter__()
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc: object) -> bool:
        _ACTIVE.reset(self._token)
        return self._bar.__exit__(*exc)

    def stage(self, what: str) -> None:
        """Start the stage ``what`` (the one before counts as done)."""
        if self.seen:
            self._bar.advance(1)
        self.seen.append(what)
        self._bar.update(label=f"{self.label}: {what}")


_ACTIVE: contextvars.ContextVar[Stages | None] = contextvars.ContextVar(
    "tokenfield_stages", default=None
)


def stage(what: str) -> None:
    """Report that the stage ``what`` starts, to the active :class:`Stages` (if any)."""
    active = _ACTIVE.get()
    if active is not None:
        active.stage(what)
