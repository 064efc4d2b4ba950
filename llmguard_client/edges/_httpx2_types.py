"""Translation between httpx2 and httpx types for the httpx2 edges (imports httpx2).

Requests go in as `httpx.Request` (a body in memory read whole: the guard may replay it; an iterator's as a
`OneShotBody`, sent as it comes on one attempt; a multipart upload whose files rewind as a `ReplayableBody`,
read again for each attempt); responses
come back as `httpx2.Response` with the core's body streamed through; errors raised
by the core are re-raised as the httpx2 exception of the same name, so an SDK's
``except httpx2.TimeoutException`` (openai: `APITimeoutError`) still matches. A guard
failure (`TTFTTimeout`, `BulkheadFull`, ...) becomes an instance of a class that is
both the guard's class and the httpx2 one: ``except TTFTTimeout``, ``.cause``,
``.record`` and `guard_failure` keep working.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
from httpx2._content import AsyncIteratorByteStream, IteratorByteStream
from httpx2._multipart import MultipartStream

from llmguard_client._http.upload import BodyKinds, OneShotBody, ReplayableBody, sent_as_read
from llmguard_client.errors import GuardFailure
from llmguard_client.telemetry.capture import CAPTURES_EXTENSION, active_captures

_HTTPX2 = BodyKinds(AsyncIteratorByteStream, IteratorByteStream, MultipartStream)


def streamed(request: httpx2.Request, *, sync: bool) -> OneShotBody | ReplayableBody | None:
    """The request's body when the guard sends it as it is read (`llmguard_client._http.upload`): an iterator's
    or an async iterator's (sent once), or a multipart upload whose files rewind (read again for each attempt,
    in worker threads for a ``sync`` caller); None for a body to read whole."""
    return sent_as_read(request.stream, _HTTPX2, sync=sync)


def core_request(request: httpx2.Request, body: bytes | OneShotBody | ReplayableBody) -> httpx.Request:
    """The httpx2 request as the core's `httpx.Request` (same method, URL, raw headers and body)."""
    extensions: dict[str, Any] = dict(request.extensions)
    captures = active_captures()
    if captures:
        extensions[CAPTURES_EXTENSION] = captures
    return httpx.Request(
        request.method,
        str(request.url),
        headers=request.headers.raw,
        stream=httpx.ByteStream(body) if isinstance(body, bytes) else body,
        extensions=extensions,
    )


def response_extensions(extensions: MutableMapping[str, Any]) -> dict[str, Any]:
    """The core response's own extensions dict, for the caller's response to share (assigned after it is built:
    its constructor copies): the guard puts the final record in it when the call ends (``extensions["llmguard"]``).
    Its ``network_stream`` is the guard's own view of the connection, which answers an httpx2 caller as well."""
    return extensions if isinstance(extensions, dict) else dict(extensions)  # httpx's is a dict


@dataclass(frozen=True, slots=True)
class SdkErrors:
    """The errors of an SDK that passes its own error, raised by its HTTP client, on to the caller as it is,
    without retrying (openai >= 3). A failure the guard made final (`GuardFailure.final`) reaches such an SDK as
    the error the SDK would have raised for it, caused by it: the SDK then skips the retries the guard would
    refuse at once, and the backoff sleeps before them, so the caller learns of a deadline when it passes."""

    timeout: Callable[[httpx2.Request], Exception]
    connection: Callable[[httpx2.Request], Exception]


def caller_error(exc: BaseException, request: httpx2.Request, sdk: SdkErrors | None) -> BaseException:
    """What an httpx2 edge raises for the core's ``exc`` (``raise error from error.__cause__``): the httpx2
    counterpart (`translate_error`), or, for a final failure and an ``sdk`` given, that SDK's own error."""
    error = translate_error(exc, request)
    if sdk is None or not (isinstance(error, GuardFailure) and error.final):
        return error
    own = sdk.timeout(request) if isinstance(error, httpx2.TimeoutException) else sdk.connection(request)
    own.__cause__ = error
    return own


def translate_error(exc: BaseException, request: httpx2.Request) -> BaseException:
    """The httpx2 counterpart of an httpx exception, to raise as it is (other exceptions are returned
    unchanged). Its ``__cause__`` is ``exc``; a guard failure's is its own cause translated too (the last
    attempt's error), so an SDK that reads the chain for the reason (anthropic: "Connection to host failed:
    Server disconnected without sending a response.") finds the httpx2 error a plain client would have met."""
    if not isinstance(exc, httpx.RequestError):  # transports raise request errors only
        return exc
    target: Any = _httpx2_class(type(exc))
    if target is None:
        return exc
    mapped: BaseException
    cause: BaseException = exc
    if isinstance(exc, GuardFailure):
        failure: GuardFailure = target(exc.message, record=exc.record, retry_after=exc.retry_after)
        failure.cause, failure.final = exc.cause, exc.final  # the instance's own (e.g. why nothing more was sent)
        mapped = failure
        if isinstance(exc.__cause__, httpx.RequestError):
            cause = translate_error(exc.__cause__, request)
    else:
        mapped = target(str(exc))
    if isinstance(mapped, httpx2.HTTPError):
        mapped.request = request
    mapped.__cause__ = cause
    return mapped


_classes: dict[type[httpx.RequestError], type[Exception] | None] = {}


def _httpx2_class(cls: type[httpx.RequestError]) -> type[Exception] | None:
    """httpx2's class for an httpx exception class: the same name, found along its MRO; for a
    guard failure class, a subclass of both."""
    if cls not in _classes:
        _classes[cls] = _find_httpx2_class(cls)
    return _classes[cls]


def _find_httpx2_class(cls: type[httpx.RequestError]) -> type[Exception] | None:
    for base in cls.__mro__:
        if base.__module__.split(".")[0] != "httpx":
            continue
        counterpart = getattr(httpx2, base.__name__, None)
        if isinstance(counterpart, type) and issubclass(counterpart, httpx2.RequestError):
            if issubclass(cls, GuardFailure):
                return type(cls.__name__, (cls, counterpart), {"__module__": cls.__module__})
            return counterpart
    return None
