"""Compressed answers (``Content-Encoding``): decoded, so the guard reads the same text the caller's client would.

A client sends ``Accept-Encoding`` (httpx: ``gzip, deflate``, with ``br`` and ``zstd`` when their libraries are
installed) and a server or a gateway may compress what it answers, streams included. The guard's readers look
for the first token, errors and usage in the text, so a guarded answer is decoded where it is received
(`decode_in_place`): the caller gets it decoded, without the ``Content-Encoding`` header, as a proxy that
decompresses would hand it on (its client has nothing left to decode). An encoding this process cannot decode
leaves the answer as it came, as a client that cannot decode it would.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import httpx


class Decoder(Protocol):
    def decode(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


class _Zlib:
    """gzip (``wbits`` 16 + 15), or deflate: zlib-wrapped as the standard says, or raw as some servers send it."""

    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._inflate = zlib.decompressobj(wbits)
        self._started = False

    def decode(self, data: bytes) -> bytes:
        first, self._started = not self._started, True
        try:
            return self._inflate.decompress(data)
        except zlib.error as exc:
            if first and self._wbits == zlib.MAX_WBITS:  # deflate without its zlib header
                self._wbits = -zlib.MAX_WBITS
                self._inflate = zlib.decompressobj(self._wbits)
                return self.decode(data)
            raise httpx.DecodingError(f"the answer's body is not valid {self._name}: {exc}") from exc

    def flush(self) -> bytes:
        try:
            return self._inflate.flush()
        except zlib.error as exc:
            raise httpx.DecodingError(f"the answer's body is not valid {self._name}: {exc}") from exc

    @property
    def _name(self) -> str:
        return "gzip" if self._wbits > zlib.MAX_WBITS else "deflate"


class _Brotli:
    def __init__(self, module: Any) -> None:
        self._module = module
        decompressor = module.Decompressor()
        self._decompress: Callable[[bytes], bytes] = getattr(decompressor, "decompress", None) or decompressor.process
        self._decompressor = decompressor

    def decode(self, data: bytes) -> bytes:
        try:
            return self._decompress(data)
        except self._module.error as exc:
            raise httpx.DecodingError(f"the answer's body is not valid brotli: {exc}") from exc

    def flush(self) -> bytes:
        finished = getattr(self._decompressor, "is_finished", None)
        if finished is not None and not finished():
            raise httpx.DecodingError("the answer's brotli body ended before its end")
        return b""


class _Zstd:
    def __init__(self, module: Any) -> None:
        self._module = module
        self._inflate = module.ZstdDecompressor().decompressobj()
        self._seen = False

    def decode(self, data: bytes) -> bytes:
        self._seen = self._seen or bool(data)
        out = []
        try:
            out.append(self._inflate.decompress(data))
            while self._inflate.eof and self._inflate.unused_data:  # the next frame
                unused = self._inflate.unused_data
                self._inflate = self._module.ZstdDecompressor().decompressobj()
                out.append(self._inflate.decompress(unused))
        except self._module.ZstdError as exc:
            raise httpx.DecodingError(f"the answer's body is not valid zstd: {exc}") from exc
        return b"".join(out)

    def flush(self) -> bytes:
        if self._seen and not self._inflate.eof:
            raise httpx.DecodingError("the answer's zstd body ended before its end")
        return b""


def _optional(*names: str) -> Any:
    for name in names:
        try:
            return __import__(name)
        except ImportError:
            continue
    return None


_BROTLI = _optional("brotli", "brotlicffi")
_ZSTANDARD = _optional("zstandard")
_DECODERS: dict[str, Callable[[], Decoder]] = {
    "gzip": lambda: _Zlib(zlib.MAX_WBITS | 16),
    "x-gzip": lambda: _Zlib(zlib.MAX_WBITS | 16),
    "deflate": lambda: _Zlib(zlib.MAX_WBITS),
}
if _BROTLI is not None:
    _DECODERS["br"] = lambda: _Brotli(_BROTLI)
if _ZSTANDARD is not None:
    _DECODERS["zstd"] = lambda: _Zstd(_ZSTANDARD)


class _Chain:
    """Encodings applied one after another are decoded last first."""

    def __init__(self, decoders: list[Decoder]) -> None:
        self._decoders = decoders

    def decode(self, data: bytes) -> bytes:
        for decoder in self._decoders:
            data = decoder.decode(data)
        return data

    def flush(self) -> bytes:
        data = b""
        for decoder in self._decoders:
            data = decoder.decode(data) + decoder.flush() if data else decoder.flush()
        return data


def decoder_for(headers: httpx.Headers) -> Decoder | None:
    """A decoder for the body these headers describe; None if it is not encoded, or if an encoding is one this
    process cannot decode."""
    names = [name.strip().lower() for name in headers.get_list("content-encoding", split_commas=True)]
    names = [name for name in names if name and name != "identity"]
    if not names or any(name not in _DECODERS for name in names):
        return None
    decoders = [_DECODERS[name]() for name in reversed(names)]
    return decoders[0] if len(decoders) == 1 else _Chain(decoders)


def decode_in_place(response: httpx.Response) -> httpx.Response:
    """``response``, a transport's answer, as the guard reads it: an httpx response with an async body (one of
    httpx2's, from a transport on httpx2's classes such as its ``MockTransport``, carried over as one), its body
    decoded as it is read, and without the ``Content-Encoding`` and ``Content-Length`` headers that described the
    encoded body (unchanged if it is not encoded). `TypeError` for any other answer, a sync body among them."""
    response = _as_httpx(response)
    stream = response.stream
    assert isinstance(stream, httpx.AsyncByteStream)  # `_as_httpx`
    decoder = decoder_for(response.headers)
    if decoder is None:
        return response
    response.stream = _Decoded(stream, decoder)
    del response.headers["content-encoding"]
    if "content-length" in response.headers:
        del response.headers["content-length"]
    return response


def _as_httpx(answer: object) -> httpx.Response:
    stream = getattr(answer, "stream", None)
    if isinstance(answer, httpx.Response) and isinstance(stream, httpx.AsyncByteStream):
        return answer
    status = getattr(answer, "status_code", None)
    read_async = callable(getattr(stream, "__aiter__", None)) and callable(getattr(stream, "aclose", None))
    if read_async and isinstance(status, int):  # an http.HTTPStatus too
        headers = getattr(answer, "headers", None)
        return httpx.Response(
            int(status),
            headers=getattr(headers, "raw", headers),
            stream=_AsyncBody(stream),
            extensions=dict(getattr(answer, "extensions", None) or {}),
        )
    close = getattr(stream, "close", None)
    if not read_async and callable(close):  # a sync body (a handler's sync iterator): its connection is let go
        close()
    if read_async:
        raise TypeError(
            f"a transport from transport_factory answered {_kind(answer)}, whose status_code {status!r} is no int, "
            "where the guard needs an httpx.Response (httpx2's serve too)"
        )
    raise TypeError(
        f"a transport from transport_factory answered {_kind(answer)} with {_kind(stream)} as its body, where the "
        "guard needs a response whose body is read asynchronously: bytes or an async iterator (httpx.MockTransport's "
        "handler may answer httpx.Response(200, content=b'...') or content=an async generator), not a sync iterator"
    )


def _kind(value: object) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


class _AsyncBody(httpx.AsyncByteStream):
    """The async body of a response that is not httpx's (httpx2's), as httpx's."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._raw:
            yield chunk

    async def aclose(self) -> None:
        await self._raw.aclose()


class _Decoded(httpx.AsyncByteStream):
    def __init__(self, raw: httpx.AsyncByteStream, decoder: Decoder) -> None:
        self._raw = raw
        self._decoder = decoder

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._raw:
            data = self._decoder.decode(chunk)
            if data:
                yield data
        data = self._decoder.flush()
        if data:
            yield data

    async def aclose(self) -> None:
        await self._raw.aclose()
