"""One progress bar for long work (tracing, steering, evaluations)."""

from __future__ import annotations

from typing import Any


class ProgressBar:
    """A rich progress bar used as a context manager; a no-op when disabled.

    Example:
        >>> with ProgressBar("tracing smollm2", total=25, unit="prompts") as bar:
        ...     bar.advance(8)
    """

    def __init__(
        self,
        label: str,
        total: float,
        *,
        enabled: bool = True,
        completed: float = 0,
        unit: str = "",
    ):
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
            MofNCompleteColumn(),
            TextColumn(unit),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            transient=False,
        )
        self._task = self._progress.add_task(label, total=total, completed=completed)

    def __enter__(self) -> ProgressBar:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> bool:
        if self._progress is not None:
            self._progress.stop()
        return False

    def advance(self, n: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)
