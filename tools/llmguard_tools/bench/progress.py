"""A rich progress bar per client, on stderr, fed by the runner's `ProgressSink` calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmguard_tools.bench.measure import Sample
from llmguard_tools.bench.tables import make_console

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

__all__ = ["RichProgress"]


class RichProgress:
    """A rich progress bar per client (on stderr), fed by the runner's `ProgressSink` calls."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress: Progress = Progress(
            TextColumn("[bold]{task.description:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=console or make_console(stderr=True),
            transient=False,
        )
        self._task: TaskID | None = None
        self._ok = 0
        self._failed = 0

    @property
    def console(self) -> Console:
        """Where the bars are drawn; what is printed here while they are live appears above them."""
        return self._progress.console

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def begin(self, client: str, total: int) -> None:
        self._ok = self._failed = 0
        self._task = self._progress.add_task(client, total=total, status="")

    def advance(self, sample: Sample) -> None:
        if self._task is None:
            return
        if sample.ok:
            self._ok += 1
        else:
            self._failed += 1
        self._progress.update(self._task, advance=1, status=f"ok {self._ok}  failed {self._failed}")

    def end(self, client: str) -> None:
        self._task = None
