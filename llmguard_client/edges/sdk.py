"""``guard.http_client_for(SDKClass)``: the guarded HTTP client of whichever kind an SDK class takes.

openai 1.x/2.x take `httpx.AsyncClient` / `httpx.Client`; openai >= 3 and anthropic >= 1
take `httpx2.AsyncClient` / `httpx2.Client`. Code that must type-check against all of
them (a library, a shared example) asks by class::

    client = openai.AsyncOpenAI(base_url=..., api_key=..., http_client=guard.http_client_for(openai.AsyncOpenAI))

The static type is read from the class's ``http_client`` parameter (so ``mypy --strict``
passes whatever the installed SDK version); at run time the same annotation picks the edge.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from llmguard_client.edges._guard_handle import GuardHandle
    from llmguard_client.edges._httpx2_types import SdkErrors

H_contra = TypeVar("H_contra", contravariant=True)


class TakesHttpClient(Protocol[H_contra]):
    """Anything callable with an ``http_client=`` keyword that takes an ``H_contra``: an SDK client class.

    ``guard.http_client_for`` matches it against each client type in turn (its overloads): solving ``H_contra``
    from an ``http_client: X | None`` parameter, mypy would answer ``X | None``, not ``X``.
    """

    def __call__(self, *, http_client: H_contra) -> object: ...


class TakesAnything:
    """A type no SDK's ``http_client`` names: a class taking it takes anything (``**kwargs: Any``, an
    ``http_client: Any``), so which client it wants is known only at run time."""


def http_client_for(guard: GuardHandle, sdk: Callable[..., object], **kwargs: Any) -> Any:
    """The guarded client (httpx or httpx2, async or sync) that ``sdk``'s ``http_client`` takes."""
    annotation = _http_client_annotation(sdk)
    flavor2 = "httpx2" in annotation
    is_async = "Async" in annotation
    if not flavor2 and "httpx" not in annotation:
        raise TypeError(
            f"cannot tell which HTTP client {_name(sdk)} takes (its http_client is annotated {annotation!r}); "
            "pass one explicitly: guard.http_client(), guard.sync_http_client(), guard.httpx2_client() "
            "or guard.sync_httpx2_client()"
        )
    if not flavor2:
        return guard.http_client(**kwargs) if is_async else guard.sync_http_client(**kwargs)
    from llmguard_client.edges.httpx2_async import httpx2_client
    from llmguard_client.edges.httpx2_sync import sync_httpx2_client

    guard._refuse_if_closed()
    build = httpx2_client if is_async else sync_httpx2_client
    return build(guard, sdk=_passes_own_errors_on(sdk), **kwargs)


def _passes_own_errors_on(sdk: Callable[..., object]) -> SdkErrors | None:
    """openai >= 3 (the openai classes that take httpx2) raises an `openai.OpenAIError` its HTTP client raised as it
    is, without retrying it: a final failure of the guard's is raised to it as its own timeout or connection error
    (what it raises for an httpx2 one), so it spends no backoff sleep on retries the guard would refuse. anthropic
    retries its own connection errors too, and is given httpx2's."""
    module = sys.modules.get(getattr(sdk, "__module__", "").partition(".")[0])
    if module is None or module.__name__ != "openai":
        return None
    from llmguard_client.edges._httpx2_types import SdkErrors

    timeout, connection = module.APITimeoutError, module.APIConnectionError
    return SdkErrors(
        timeout=lambda request: timeout(request=request), connection=lambda request: connection(request=request)
    )


def _http_client_annotation(sdk: Callable[..., object]) -> str:
    parameter = _http_client_parameter(sdk)
    if parameter is None:
        raise TypeError(
            f"{_name(sdk)} takes no http_client= argument; http_client_for() expects an SDK client class "
            "such as openai.AsyncOpenAI, openai.OpenAI, anthropic.AsyncAnthropic or anthropic.Anthropic; "
            "for an SDK that takes its HTTP client under another name, pass it one explicitly: "
            "guard.http_client(), guard.sync_http_client(), guard.httpx2_client() or guard.sync_httpx2_client()"
        )
    annotation = parameter.annotation
    return annotation if isinstance(annotation, str) else str(annotation)


def _http_client_parameter(sdk: Callable[..., object]) -> inspect.Parameter | None:
    """``sdk``'s ``http_client`` parameter; for a class whose ``__init__`` passes ``**kwargs`` on (a user's
    subclass of an SDK class), the first one up its MRO that names it. A ``**kwargs`` that no base names it in
    stands for it (it takes the keyword, of a type no annotation tells)."""
    forwarded: inspect.Parameter | None = None
    for callable_ in _constructors(sdk):
        try:
            parameters = inspect.signature(callable_).parameters
        except (TypeError, ValueError):
            return forwarded
        if "http_client" in parameters:
            return parameters["http_client"]
        forwarded = next((p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None)
        if forwarded is None:
            return None
    return forwarded


def _constructors(sdk: Callable[..., object]) -> list[Callable[..., object]]:
    """``sdk`` itself, then (for a class) each ``__init__`` its bases define, nearest first."""
    if not isinstance(sdk, type):
        return [sdk]
    bases = [vars(klass)["__init__"] for klass in sdk.__mro__[1:] if klass is not object and "__init__" in vars(klass)]
    return [sdk, *bases]


def _name(sdk: object) -> str:
    return getattr(sdk, "__qualname__", None) or repr(sdk)
