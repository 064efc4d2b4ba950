"""Log records emitted during a bench run, kept out of the printed report.

The library logs through ``logging`` under ``llmguard_client`` (e.g. the router's "replica ... is degraded"
warning). Left to Python's last-resort handler they go to stderr whenever they happen, and a terminal shows
them in the middle of a report. `captured` holds them instead: while a progress display is live they are
printed through its console (rich keeps them above the bars, on stderr); otherwise they are kept and printed
after the report by `RunLog.print_after`, wrapped to the console's width.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["RunLog", "captured"]

SHOWN = 20
"""At most this many distinct messages are printed after a report; the rest are counted."""


class RunLog(logging.Handler):
    """A handler for WARNING and above: to the live progress console, else held for after the report."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.live: Console | None = None
        """The progress display's console while it is live (records go there at once)."""
        self.held: dict[str, int] = {}
        """message -> how many times it was logged, in first-seen order."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.levelname.lower()} {record.name}: {record.getMessage()}"
        except Exception:  # a bad format string must not break the run
            self.handleError(record)
            return
        if self.live is not None:
            from rich.markup import escape

            self.live.print(f"[yellow]log[/yellow] {escape(text)}", highlight=False)
        else:
            self.held[text] = self.held.get(text, 0) + 1

    def print_after(self, console: Console) -> None:
        """Print the held records (deduplicated, at most `SHOWN`) below a report, then forget them."""
        from rich.markup import escape

        from llmguard_tools.bench.tables import hanging

        if not self.held:
            return
        items = list(self.held.items())
        total = sum(self.held.values())
        console.print(f"[dim]{total} log record(s) during the run:[/dim]")
        lines = [escape(f"{text} (x{n})" if n > 1 else text) for text, n in items[:SHOWN]]
        if len(items) > SHOWN:
            lines.append(f"... and {len(items) - SHOWN} more distinct message(s)")
        console.print(hanging("[yellow]log[/yellow]", lines))
        self.held.clear()


@contextlib.contextmanager
def captured(logger: str = "llmguard_client") -> Iterator[RunLog]:
    """Route ``logger``'s WARNING+ records to a `RunLog` for the duration of the block."""
    handler = RunLog()
    target = logging.getLogger(logger)
    target.addHandler(handler)
    try:
        yield handler
    except BaseException:  # the run failed before its report: do not lose what was logged
        for text, n in handler.held.items():
            print(f"log {text}" + (f" (x{n})" if n > 1 else ""), file=sys.stderr)
        raise
    finally:
        target.removeHandler(handler)
