"""Attribute values derived from records (`_otel_attributes`): operation names, error types, URLs."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from llmguard_client.telemetry._otel_attributes import UrlCache, epoch_ns, time_per_output_chunk
from llmguard_client.telemetry.otel import attempt_error_type, call_error_type, operation_name, scrub_url, server_of
from llmguard_client.telemetry.record import AttemptRecord
from tests.telemetry.otel_harness import R1, T0, T0_NS, new_record


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/chat/completions", "chat"),
        ("/v1/chat/completions", "chat"),
        ("/openai/deployments/x/chat/completions/", "chat"),
        ("/v1/completions", "text_completion"),
        ("/v1/embeddings", "embeddings"),
        ("/v1/models", "_OTHER"),
    ],
)
def test_operation_name(path: str, name: str) -> None:
    assert operation_name(path) == name


@pytest.mark.parametrize(
    ("url", "scrubbed"),
    [
        ("http://h:1/v1/chat/completions", "http://h:1/v1/chat/completions"),
        ("https://u:p@h/v1", "https://REDACTED:REDACTED@h/v1"),
        ("https://sk-token@h/v1", "https://REDACTED@h/v1"),
        ("https://h/v1?api-version=1&api_key=s&flag", "https://h/v1?api-version=1&api_key=REDACTED&flag"),
        ("https://h/v1#x", "https://h/v1"),
        ("http://[::1]:80/x", "http://[::1]:80/x"),
    ],
)
def test_scrub_url(url: str, scrubbed: str) -> None:
    assert scrub_url(url) == scrubbed


def test_server_of() -> None:
    assert server_of("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert server_of("https://Example.COM/v1") == ("example.com", 443)
    assert server_of("http://[::1]/v1") == ("::1", 80)
    assert server_of("http://h:notaport/") is None
    assert server_of("/relative") is None


def test_call_error_type() -> None:
    record = new_record().snapshot()
    assert call_error_type(record) is None  # pending
    assert call_error_type(replace(record, status="ok")) is None
    assert call_error_type(replace(record, status="http_error", http_status=500)) == "500"
    assert call_error_type(replace(record, status="timeout")) == "timeout"


@pytest.mark.parametrize(
    ("outcome", "status_code", "error", "expected"),
    [
        ("lost", None, None, None),
        ("cancelled", 503, "connect_error", None),  # a cancelled attempt carries no error of its own
        ("failed", 503, None, "503"),
        ("failed", None, "connect_error", "connect_error"),
        ("failed", None, None, "_OTHER"),
        ("won", 200, "read_error", "read_error"),  # the body broke after winning
        ("won", 200, None, None),
    ],
)
def test_attempt_error_type(outcome: Any, status_code: int | None, error: str | None, expected: str | None) -> None:
    attempt = AttemptRecord(
        index=0, replica=R1, kind="primary", start=T0, outcome=outcome, status_code=status_code, error=error
    )
    assert attempt_error_type(attempt) == expected


def test_time_per_output_chunk() -> None:
    record = replace(
        new_record().snapshot(), status="ok", first_token=T0 + 0.1, finish=T0 + 0.5, chunks=5, completion_tokens=99
    )
    assert time_per_output_chunk(record) == pytest.approx(0.1)  # 0.4 s over the 4 chunks after the first
    record = replace(record, chunks=None)  # not filled: one chunk per completion token
    assert time_per_output_chunk(record) == pytest.approx(0.4 / 98)
    assert time_per_output_chunk(replace(record, completion_tokens=1)) is None  # no gap to measure
    assert time_per_output_chunk(replace(record, chunks=5, status="timeout")) is None  # only completed streams


def test_epoch_ns_maps_the_monotonic_clock_onto_the_record_start() -> None:
    record = new_record()
    assert epoch_ns(record, T0 + 0.25) == T0_NS + 250_000_000
    before = time.time_ns()
    assert before <= epoch_ns(record, None) <= time.time_ns()


def test_url_cache_is_bounded_and_still_answers() -> None:
    cache = UrlCache()
    for port in range(1, 700):
        assert cache.server(f"http://h:{port}") == ("h", port)
        assert cache.url(f"https://u:p@h:{port}/v1?key=k") == (
            f"https://REDACTED:REDACTED@h:{port}/v1?key=REDACTED",
            ("h", port),
        )
    assert len(cache._servers) == len(cache._urls) == 512
