"""`LazyModule`: a module name that imports the module on first attribute access."""

from __future__ import annotations

import importlib


class LazyModule:
    """Stands for an optional module in a module's globals, so that ``typing.get_type_hints`` resolves an
    annotation naming it (``httpx2.AsyncClient``) without the module importing it: it is imported when the
    annotation is read (a ModuleNotFoundError if it is not installed)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> object:
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"
