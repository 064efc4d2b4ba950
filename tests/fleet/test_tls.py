"""``rediss://`` against a real TLS-only redis-server with a throwaway CA: with the CA named in the URL
(``?ssl_ca_certs=...``) two Guards connect and share a cool-down over TLS, and ``llmguard rollout`` works;
without it, or over plain ``redis://``, the store fails open with the reason and no password shown."""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import pytest

from llmguard_client import Guard
from llmguard_tools.cli import main
from tests.redis_cluster import TLSRedisServer

REPLICAS = ["http://127.0.0.1:9/r0"]


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110 (polled state has no event)
            await anyio.sleep(0.01)


async def test_two_guards_share_a_cool_down_over_tls(redis_tls: TLSRedisServer) -> None:
    url = redis_tls.url(ssl_cert_reqs="required")
    a = Guard(REPLICAS, fleet=url, name="checkout", hedge=None)
    b = Guard(REPLICAS, fleet=url, name="checkout", hedge=None)
    for g in (a, b):
        g._fleet.store.connect_timeout = 5.0  # type: ignore[union-attr]  # a busy machine's TLS handshake
    try:
        for g in (a, b):
            await g.__aenter__()
        await until(lambda: all(g.snapshot().fleet.connected for g in (a, b)))  # type: ignore[union-attr]
        a._replica_set.cool_down(a._replica_set.states[0], anyio.current_time(), 30.0)
        await until(lambda: b._replica_set.states[0].cooling(anyio.current_time()))
        fleet = b.snapshot().fleet
        assert fleet is not None and fleet.last_error is None
        assert fleet.url == (
            f"rediss://:***@127.0.0.1:{redis_tls.port}/0?ssl_ca_certs={redis_tls.ca}&ssl_cert_reqs=required"
        )
    finally:
        for g in (a, b):
            await g.aclose()


@pytest.mark.parametrize("cert_reqs", ["NONE", "None", "Required"])
async def test_a_tls_choice_in_any_case_connects(redis_tls: TLSRedisServer, cert_reqs: str) -> None:
    """redis-py takes lower case only: these built a Guard whose store stayed degraded ("Invalid SSL
    Certificate Requirements Flag: NONE"); they are passed on in lower case."""
    g = Guard(REPLICAS, fleet=redis_tls.url(ssl_cert_reqs=cert_reqs), name="checkout", hedge=None)
    g._fleet.store.connect_timeout = 5.0  # type: ignore[union-attr]  # a busy machine's TLS handshake
    try:
        await g.__aenter__()
        await until(lambda: g.snapshot().fleet.state in ("connected", "degraded"))  # type: ignore[union-attr]
        fleet = g.snapshot().fleet
        assert fleet is not None and fleet.connected and fleet.last_error is None, fleet
        assert fleet.url.endswith(f"ssl_cert_reqs={cert_reqs.lower()}")
    finally:
        await g.aclose()


@pytest.mark.parametrize(
    ("scheme_and_query", "says"),
    [("rediss", "CERTIFICATE_VERIFY_FAILED"), ("redis", "Connection")],
    ids=["no-ca", "plain-redis"],
)
async def test_without_the_ca_or_without_tls_the_store_fails_open(
    redis_tls: TLSRedisServer, caplog: pytest.LogCaptureFixture, scheme_and_query: str, says: str
) -> None:
    caplog.set_level(logging.WARNING, "llmguard_client")
    url = f"{scheme_and_query}://:{redis_tls.password}@127.0.0.1:{redis_tls.port}/0"
    g = Guard(REPLICAS, fleet=url, name="checkout", hedge=None)
    try:
        await g.__aenter__()
        await until(lambda: g.snapshot().fleet.degraded)  # type: ignore[union-attr]
        fleet = g.snapshot().fleet
        assert fleet is not None and fleet.last_error is not None and says in fleet.last_error, fleet.last_error
        assert all(redis_tls.password not in r.getMessage() for r in caplog.records)
        assert redis_tls.password not in repr(g.snapshot())
    finally:
        await g.aclose()


def test_the_rollout_command_over_tls(redis_tls: TLSRedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    url = redis_tls.url()
    assert main(["rollout", "set", "0.5", "--fleet", url, "--name", "checkout"]) == 0
    assert capsys.readouterr().out == (
        "checkout: 0.5 of calls guarded on every process (fraction 0.5, kill switch off)\n"
    )
