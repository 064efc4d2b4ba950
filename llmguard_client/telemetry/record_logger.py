"""`RecordLogger`: an ``on_record`` callback that writes each `PhaseRecord` as one JSON line, to a file or a logger."""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from llmguard_client.errors import GuardConfigError
from llmguard_client.telemetry._jsonl import JsonLinesFile
from llmguard_client.telemetry.record import PhaseRecord

if TYPE_CHECKING:
    AnyLoggerAdapter = logging.LoggerAdapter[Any]
else:  # not subscriptable at run time before Python 3.11: typing.get_type_hints must resolve the annotation
    AnyLoggerAdapter = logging.LoggerAdapter


def _level(level: object) -> int:
    """``level`` as a logging level: a positive int (``logging.INFO``), or a level name logging knows (``"INFO"``)."""
    named = logging.getLevelName(level) if isinstance(level, str) else None  # logging's own name -> level mapping
    if isinstance(named, int) and not isinstance(named, bool) and named > 0:
        return named
    if isinstance(level, int) and not isinstance(level, bool) and level > 0:
        return level
    raise GuardConfigError(
        "RecordLogger level must be a logging level: a positive int such as logging.INFO, or the name of one "
        f"such as 'INFO' (DEBUG, INFO, WARNING, ERROR, CRITICAL, or one given to logging.addLevelName), got {level!r}"
    )


class RecordLogger:
    """An ``on_record`` callback that writes each record as one JSON line.

    >>> guard = Guard(..., on_record=RecordLogger("records.jsonl"))   # a file: nothing else to set up
    >>> guard = Guard(..., on_record=RecordLogger())                  # logging: llmguard_client.record, INFO

    With a path, lines are appended to that file and flushed one by one; a file moved or removed
    (log rotation) is followed by a fresh one at the path; the file is closed by ``close()``, which
    the Guard calls when it is closed (a later record reopens it). An unwritable path is a
    `GuardConfigError` at once. Without a path, each line is logged on ``logger`` (a `logging.Logger` or a
    logger's name) at ``level`` (``logging.INFO``, or a level name such as ``"INFO"``): it
    reaches a file only through the handlers you configure (``logging.basicConfig(level=logging.INFO)``).
    Either way ``llmguard compare`` reads the lines.
    """

    __slots__ = ("_file", "_level", "_logger")

    def __init__(
        self,
        path: str | os.PathLike[str] | logging.Logger | None = None,
        *,
        logger: logging.Logger | AnyLoggerAdapter | str | None = None,
        level: int | str = logging.INFO,
    ) -> None:
        if isinstance(path, (logging.Logger, logging.LoggerAdapter)):  # the earlier positional form
            path, logger = None, path if logger is None else logger
        if path is not None and logger is not None:
            raise GuardConfigError("RecordLogger takes a file path or a logger, not both")
        if logger is not None and not isinstance(logger, str) and not _logs(logger):
            raise GuardConfigError(
                "RecordLogger logger must be a logging.Logger (or a LoggerAdapter, or anything with isEnabledFor() "
                f"and log()), a logger's name (e.g. 'myapp.records') or None, got {logger!r}"
            )
        level = _level(level)
        self._file = JsonLinesFile(path) if path is not None else None
        logger = "llmguard_client.record" if logger is None else logger
        self._logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self._level = level

    @property
    def path(self) -> str | None:
        """The file written to, or None when records are logged."""
        return None if self._file is None else self._file.path

    def __call__(self, record: PhaseRecord) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record.to_dict(), separators=(",", ":"), default=str))
        elif self._logger.isEnabledFor(self._level):
            self._logger.log(
                self._level,
                "%s",
                json.dumps(record.to_dict(), separators=(",", ":"), default=str),
                extra={"llmguard": record},
            )

    def close(self) -> None:
        """Close the file (if any) now; a later record reopens it. Idempotent."""
        if self._file is not None:
            self._file.close()


def _logs(logger: object) -> bool:
    """Whether ``logger`` logs as a `logging.Logger` does (a LoggerAdapter, structlog's stdlib-like loggers...)."""
    return callable(getattr(logger, "isEnabledFor", None)) and callable(getattr(logger, "log", None))
