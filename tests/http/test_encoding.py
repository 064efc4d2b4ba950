"""Compressed answers decoded for the guard's readers: each encoding httpx decodes, in any chunking."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator

import httpx
import pytest

from llmguard_client._http.encoding import decode_in_place, decoder_for

brotli = pytest.importorskip("brotli")  # both test dependencies: httpx decodes br and zstd when they are installed
zstandard = pytest.importorskip("zstandard")

TEXT = b'data: {"choices":[{"delta":{"content":"hello"}}]}\n\n' * 50


def deflate_raw(data: bytes) -> bytes:
    squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return squeeze.compress(data) + squeeze.flush()


ENCODED = {
    "gzip": gzip.compress(TEXT),
    "x-gzip": gzip.compress(TEXT),
    "deflate": zlib.compress(TEXT),
    "br": brotli.compress(TEXT),
    "zstd": zstandard.ZstdCompressor().compress(TEXT),
    "gzip, br": brotli.compress(gzip.compress(TEXT)),
}


def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def decode(encoding: str, data: bytes, size: int) -> bytes:
    decoder = decoder_for(httpx.Headers({"content-encoding": encoding}))
    assert decoder is not None
    return b"".join(decoder.decode(chunk) for chunk in chunks(data, size)) + decoder.flush()


@pytest.mark.parametrize("size", [1, 7, 1 << 20])
@pytest.mark.parametrize("encoding", list(ENCODED))
def test_each_encoding_decodes_to_the_text_in_any_chunking(encoding: str, size: int) -> None:
    assert decode(encoding, ENCODED[encoding], size) == TEXT


def test_deflate_without_its_zlib_header_decodes_too() -> None:
    assert decode("deflate", deflate_raw(TEXT), 5) == TEXT


def test_zstd_in_several_frames_decodes_every_frame() -> None:
    squeeze = zstandard.ZstdCompressor()
    assert decode("zstd", squeeze.compress(TEXT[:100]) + squeeze.compress(TEXT[100:]), 9) == TEXT


@pytest.mark.parametrize("encoding", ["", "identity", "compress", "gzip, snappy"])
def test_no_encoding_or_one_this_process_cannot_decode_has_no_decoder(encoding: str) -> None:
    assert decoder_for(httpx.Headers({"content-encoding": encoding})) is None
    assert decoder_for(httpx.Headers()) is None


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
def test_a_body_that_is_not_what_its_encoding_says_raises_a_decoding_error(encoding: str) -> None:
    with pytest.raises(httpx.DecodingError, match="not valid"):
        decode(encoding, b"plain text, not compressed", 100)


class Body(httpx.AsyncByteStream):
    def __init__(self, parts: list[bytes]) -> None:
        self.parts, self.closed = parts, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part

    async def aclose(self) -> None:
        self.closed = True


async def test_decode_in_place_reads_the_text_and_drops_the_headers_of_the_encoded_body() -> None:
    body = Body(chunks(ENCODED["gzip"], 10))
    headers = {"content-encoding": "gzip", "content-length": str(len(ENCODED["gzip"])), "x-kept": "1"}
    response = decode_in_place(httpx.Response(200, headers=headers, stream=body))
    assert b"".join([part async for part in response.stream]) == TEXT  # type: ignore[union-attr]
    assert "content-encoding" not in response.headers and "content-length" not in response.headers
    assert response.headers["x-kept"] == "1"
    await response.aclose()
    assert body.closed


async def test_decode_in_place_leaves_a_body_it_cannot_decode_as_it_came() -> None:
    body = Body([b"opaque"])
    response = decode_in_place(httpx.Response(200, headers={"content-encoding": "snappy"}, stream=body))
    assert response.stream is body and response.headers["content-encoding"] == "snappy"
