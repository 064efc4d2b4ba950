"""An append-only JSON-lines file that survives log rotation, for `RecordLogger(path)`.

Like `logging.handlers.WatchedFileHandler`: before each line the path is checked, and if the file
was moved or removed (logrotate, ``mv records.jsonl old.jsonl``), the next line goes to a fresh file
at the path. Each line is flushed as it is written, so a reader (``llmguard compare``) sees every
finished call. The file is closed by `JsonLinesFile.close` (the Guard calls it in ``aclose``), else
when the object is collected or at process exit: never left to the garbage collector's warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from typing import IO

from llmguard_client.errors import GuardConfigError

logger = logging.getLogger("llmguard_client")


class _Stream:
    """The open file and the identity (device, inode) of what it points at; shared with the finalizer."""

    __slots__ = ("file", "identity")

    def __init__(self) -> None:
        self.file: IO[str] | None = None
        self.identity: tuple[int, int] | None = None

    def close(self) -> None:
        """Close the file (its descriptor is closed even if flushing what is left fails: a full disk)."""
        file, self.file, self.identity = self.file, None, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()


class JsonLinesFile:
    """Appends one line per `write` to ``path``; reopens the path when the file was moved away."""

    __slots__ = ("__weakref__", "_failing", "_finalizer", "_lock", "_stream", "path")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise GuardConfigError(f"RecordLogger path must be a file path (str or os.PathLike), got {path!r}")
        self.path: str = os.fsdecode(os.fspath(path))
        self._lock = threading.Lock()
        self._stream = _Stream()
        self._failing = False
        try:
            self._open()
        except OSError as exc:
            raise GuardConfigError(
                f"RecordLogger cannot append to {self.path!r}: {exc.strerror or exc}; give the path of a file "
                "in an existing, writable directory (e.g. 'records.jsonl')"
            ) from exc
        self._finalizer = weakref.finalize(self, _Stream.close, self._stream)

    def write(self, line: str) -> None:
        """Append ``line`` and a newline, flushed. An OSError is logged (once until writes work again), not raised:
        a full disk must not fail the calls being recorded."""
        with self._lock:
            try:
                if self._moved():
                    self._stream.close()
                if self._stream.file is None:
                    self._open()
                file = self._stream.file
                assert file is not None
                file.write(line + "\n")
                file.flush()
            except OSError as exc:
                if not self._failing:
                    logger.warning(
                        "RecordLogger cannot write to %s (%s); records are dropped until it can", self.path, exc
                    )
                self._failing = True
                self._stream.close()
                return
            if self._failing:
                logger.info("RecordLogger writes to %s again", self.path)
                self._failing = False

    def close(self) -> None:
        """Close the file now; a later `write` reopens the path. Idempotent."""
        with self._lock:
            self._stream.close()

    def _open(self) -> None:
        file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held open across writes, closed by close()
        try:
            stat = os.fstat(file.fileno())
        except OSError:
            file.close()
            raise
        self._stream.file, self._stream.identity = file, (stat.st_dev, stat.st_ino)

    def _moved(self) -> bool:
        if self._stream.file is None:
            return False
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (stat.st_dev, stat.st_ino) != self._stream.identity
