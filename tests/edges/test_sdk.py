"""guard.http_client_for(SDKClass): the edge an SDK's http_client= takes, chosen from its annotation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmguard_client import Guard

httpx2 = pytest.importorskip("httpx2")
openai = pytest.importorskip("openai")


class LegacyAsyncSDK:
    def __init__(self, *, api_key: str = "", http_client: httpx.AsyncClient | None = None) -> None:
        self.http_client = http_client


class LegacySyncSDK:
    def __init__(self, *, http_client: "httpx.Client | None" = None) -> None:  # noqa: UP037 - a string, as under PEP 563
        self.http_client = http_client


class NoClientSDK:
    def __init__(self, *, api_key: str = "") -> None:
        self.api_key = api_key


class OpaqueSDK:
    def __init__(self, *, http_client: object = None) -> None:
        self.http_client = http_client


@pytest.fixture
def guard() -> Guard:
    return Guard(["http://a"], transport_factory=lambda r: httpx.MockTransport(lambda q: httpx.Response(200)))


def test_openai_classes_get_the_httpx2_edges(guard: Guard) -> None:
    assert isinstance(guard.http_client_for(openai.AsyncOpenAI), httpx2.AsyncClient)
    assert isinstance(guard.http_client_for(openai.OpenAI), httpx2.Client)


def test_httpx_annotated_classes_get_the_httpx_edges(guard: Guard) -> None:
    assert isinstance(guard.http_client_for(LegacyAsyncSDK), httpx.AsyncClient)
    assert isinstance(guard.http_client_for(LegacySyncSDK), httpx.Client)
    client = guard.http_client_for(LegacyAsyncSDK, headers={"x-team": "a"})
    assert client.headers["x-team"] == "a"


def test_a_class_without_http_client_is_refused_clearly(guard: Guard) -> None:
    with pytest.raises(
        TypeError, match=r"NoClientSDK takes no http_client= argument.*openai\.AsyncOpenAI.*guard\.http_client\(\)"
    ):
        guard.http_client_for(NoClientSDK)  # type: ignore[arg-type]


def test_an_unreadable_annotation_is_refused_with_the_explicit_factories(guard: Guard) -> None:
    with pytest.raises(TypeError, match=r"cannot tell which HTTP client OpaqueSDK takes.*guard\.sync_http_client\(\)"):
        guard.http_client_for(OpaqueSDK)


@pytest.mark.parametrize("method", ["httpx2_client", "sync_httpx2_client"])
def test_without_httpx2_its_clients_name_the_extra_that_brings_it(
    guard: Guard, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "httpx2", None)  # as in an install without it: `import httpx2` fails
    with pytest.raises(ModuleNotFoundError, match=rf"guard\.{method}\(\) needs httpx2, the \[httpx2\] extra") as err:
        getattr(guard, method)()
    assert err.value.name == "httpx2"
    assert isinstance(guard.http_client(), httpx.AsyncClient)  # the httpx edges need no httpx2


def test_mypy_types_the_client_as_the_one_the_class_takes_not_optional() -> None:
    """mypy solved the SDK's ``http_client: X | None`` to ``X | None``; the user's ``await client.aclose()`` failed
    ``mypy --strict``. Run with the project's mypy settings and cache (warm: ~1 s)."""
    pytest.importorskip("mypy")
    root = Path(__file__).resolve().parents[2]
    sample = Path(__file__).with_name("typed_sdk_clients.py")
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--no-error-summary", str(sample)],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (run.returncode, run.stdout + run.stderr) == (0, "")


class ForwardingAsyncSDK(LegacyAsyncSDK):
    """A user's subclass that passes its keywords on to the SDK class."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class ForwardingTwiceSDK(ForwardingAsyncSDK):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)


def test_a_subclass_passing_kwargs_on_gets_the_client_its_base_takes(guard: Guard) -> None:
    class MyOpenAI(openai.AsyncOpenAI):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)

    assert isinstance(guard.http_client_for(MyOpenAI), httpx2.AsyncClient)
    assert isinstance(guard.http_client_for(ForwardingAsyncSDK), httpx.AsyncClient)
    assert isinstance(guard.http_client_for(ForwardingTwiceSDK), httpx.AsyncClient)


def test_kwargs_that_reach_no_http_client_are_refused_clearly(guard: Guard) -> None:
    class ForwardsToNothing(NoClientSDK):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)

    def factory(**kwargs: Any) -> object:
        return kwargs

    with pytest.raises(TypeError, match=r"ForwardsToNothing takes no http_client= argument"):
        guard.http_client_for(ForwardsToNothing)
    with pytest.raises(TypeError, match=r"cannot tell which HTTP client .*factory takes.*guard\.http_client\(\)"):
        guard.http_client_for(factory)
