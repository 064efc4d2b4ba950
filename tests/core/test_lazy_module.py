"""LazyModule: an optional module named in annotations, imported only when one is read."""

from __future__ import annotations

import sys
import typing

import pytest

from llmguard_client import Guard
from llmguard_client._core.lazy_module import LazyModule
from tests.probe import modules_after_import


def test_the_package_does_not_import_httpx2() -> None:
    assert "httpx2" not in modules_after_import()


def test_an_annotation_naming_the_module_resolves_when_read() -> None:
    httpx2 = pytest.importorskip("httpx2")
    assert typing.get_type_hints(Guard.httpx2_client)["return"] is httpx2.AsyncClient
    assert typing.get_type_hints(Guard.sync_httpx2_client)["return"] is httpx2.Client


def test_without_the_module_reading_it_names_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx2", None)  # as in an install without it
    with pytest.raises(ModuleNotFoundError, match="httpx2"):
        typing.get_type_hints(Guard.httpx2_client)
    assert repr(LazyModule("httpx2")) == "<module 'httpx2', imported on first use>"
