"""Tables fitted to a width: the one layout of the tables the tools print.

Rows are clients or cohorts, columns are figures; a table whose columns do not fit the width continues in
another table that repeats its key columns. `fit_columns` decides the split for ``llmguard bench``'s rich
tables (`llmguard_tools.bench.tables`, measured by rich) and ``llmguard compare``'s plain text (`text_tables`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["fit_columns", "text_tables"]

T = TypeVar("T")


def fit_columns(columns: Sequence[T], fits: Callable[[list[T]], bool]) -> list[list[T]]:
    """``columns`` in order, in the fewest consecutive groups for which ``fits`` holds (greedy: a column that
    does not fit with those before it starts the next group; a column alone is always a group)."""
    groups: list[list[T]] = []
    for column in columns:
        if groups and fits([*groups[-1], column]):
            groups[-1].append(column)
        else:
            groups.append([column])
    return groups


def text_tables(rows: Sequence[Sequence[str]], keys: int, width: int) -> list[str]:
    """``rows`` (headers first) as text tables no wider than ``width`` where possible, each repeating the first
    ``keys`` columns (left-aligned; the others right-aligned), separated by a blank line."""
    key_columns = list(range(keys))
    groups = fit_columns(range(keys, len(rows[0])), lambda group: _width(rows, [*key_columns, *group]) <= width)
    lines: list[str] = []
    for n, group in enumerate(groups):
        lines += [""] if n else []
        lines += _text_table([[row[i] for i in (*key_columns, *group)] for row in rows], keys)
    return lines


def _text_table(rows: Sequence[Sequence[str]], keys: int) -> list[str]:
    """Columns padded to their widest cell; the first ``keys`` left-aligned, the rest right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(w) if i < keys else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _width(rows: Sequence[Sequence[str]], columns: Sequence[int]) -> int:
    return sum(max(len(row[i]) for row in rows) for i in columns) + 2 * (len(columns) - 1)
