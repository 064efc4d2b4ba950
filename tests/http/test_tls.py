"""A Guard trusts the CAs an httpx client built at the same moment would: ``SSL_CERT_FILE``/``SSL_CERT_DIR`` set
after an earlier Guard of the process was built count for every later one, as they do for the plain SDK."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmguard_client import Guard, Tier
from llmguard_client._http.tls import default_tls_context
from tests.loopback import LoopbackServer, Script, running
from tests.redis_cluster import OPENSSL, make_certificates

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
CA_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A throwaway CA and a 127.0.0.1 certificate it signed: (ca, cert, key)."""
    if OPENSSL is None:
        pytest.skip("needs the openssl command to make a CA")
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tls_server(certificates: tuple[Path, Path, Path]) -> Iterator[LoopbackServer]:
    """An HTTPS loopback server whose certificate only the throwaway CA vouches for."""
    _, cert, key = certificates
    server = LoopbackServer("tls", default=Script(tokens=2), tls=(cert, key))
    with running([server]):
        yield server


@pytest.fixture(autouse=True)
def _no_ca_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CA_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _ca_as(variable: str, ca: Path, directory: Path) -> str:
    """``ca`` as ``SSL_CERT_FILE`` names it (the file) or as ``SSL_CERT_DIR`` does (a hashed directory)."""
    if variable == "SSL_CERT_FILE":
        return str(ca)
    assert OPENSSL is not None
    shutil.copy(ca, directory / "ca.pem")
    subprocess.run([OPENSSL, "rehash", str(directory)], capture_output=True, timeout=30, check=True)
    return str(directory)


@pytest.mark.parametrize("variable", CA_VARIABLES)
async def test_a_ca_named_after_a_first_guard_was_built_is_trusted_by_the_next(
    variable: str,
    tls_server: LoopbackServer,
    certificates: tuple[Path, Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tiers = {"t": Tier(ttft=10, total=20)}
    async with Guard([tls_server.url], tiers), Guard(["https://127.0.0.1:9"], tiers):
        pass  # Guards built before the environment names the CA
    monkeypatch.setenv(variable, _ca_as(variable, certificates[0], tmp_path))
    async with Guard([tls_server.url], tiers, failure_mode="raise", retry=None) as guard:
        async with guard.http_client() as client:
            response = await client.post(tls_server.url + "/v1/chat/completions", json=BODY)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"]
    assert len(tls_server.received) == 1


def test_one_context_per_value_of_the_environment(
    certificates: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    default = default_tls_context()
    assert default_tls_context() is default  # not rebuilt per call
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates[0]))
    ours = default_tls_context()
    assert ours is not default and default_tls_context() is ours
    assert [c["subject"] for c in ours.get_ca_certs()] == [((("commonName", "llmguard test CA"),),)]
    monkeypatch.delenv("SSL_CERT_FILE")
    assert default_tls_context() is default


async def test_a_refused_certificate_is_not_sent_again_to_the_same_replica(tls_server: LoopbackServer) -> None:
    """No CA vouches for the replica's certificate: every handshake with it would fail alike, so the error comes at
    once (one attempt, no backoff), as the plain SDK's with ``max_retries=0`` does. Its message says why, as plain
    httpx's does."""
    tiers = {"t": Tier(ttft=10, total=20)}
    async with Guard([tls_server.url], tiers, failure_mode="raise") as guard, guard.http_client() as client:
        with pytest.raises(httpx.ConnectError, match=r"1 attempt\(s\).*connect_error") as raised:
            await client.post(tls_server.url + "/v1/chat/completions", json=BODY)
    assert "CERTIFICATE_VERIFY_FAILED" in str(raised.value.__cause__)
    assert "the last one's error: ConnectError: [SSL: CERTIFICATE_VERIFY_FAILED]" in str(raised.value)
    assert tls_server.received == []


async def test_another_replica_serves_a_call_whose_first_replica_has_a_refused_certificate(
    tls_server: LoopbackServer,
) -> None:
    plain = LoopbackServer("plain", default=Script(tokens=2))
    tiers = {"t": Tier(ttft=10, total=20)}
    with running([plain]):
        async with Guard([tls_server.url, plain.url], tiers, failure_mode="raise") as guard:
            async with guard.http_client() as client:
                for _ in range(3):
                    response = await client.post(tls_server.url + "/v1/chat/completions", json=BODY)
                    assert response.status_code == 200
    assert len(plain.received) == 3 and tls_server.received == []


@pytest.mark.parametrize("max_retries", [0, 2])
async def test_a_refused_certificate_is_the_sdks_to_retry_when_no_other_replica_can_take_the_call(
    tls_server: LoopbackServer, max_retries: int
) -> None:
    """With no other replica the guard sends no more, and leaves the failure to the SDK, as without a guard: its
    ``max_retries`` decides how many connections are tried (behind one name a certificate rotation half rolled out
    may present the trusted one on the next), and none is refused at once for the guard's having given up."""
    openai = pytest.importorskip("openai")
    tiers = {"t": Tier(ttft=10, total=20)}
    async with Guard([tls_server.url], tiers) as guard:
        client = openai.AsyncOpenAI(
            base_url=tls_server.url + "/v1",
            api_key="k",
            max_retries=max_retries,
            http_client=guard.http_client_for(openai.AsyncOpenAI),
        )
        with guard.capture() as calls, pytest.raises(openai.APIConnectionError):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        await client.close()
    assert sum(len(call.attempts) for call in calls) == 1 + max_retries  # as many handshakes as the plain SDK's
