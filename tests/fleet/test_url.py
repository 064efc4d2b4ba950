"""``Guard(fleet=..., name=...)`` checked at construction: a malformed URL or name is a GuardConfigError naming
what is wrong and what is accepted, with the password masked; a well-formed unreachable one is accepted."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio

from llmguard_client import Guard
from llmguard_client._fleet import parse_fleet_url
from llmguard_client._fleet.url import redact_text
from llmguard_client.errors import GuardConfigError
from tests.redis_cluster import OPENSSL, make_certificates

REPLICAS = ["http://127.0.0.1:9"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://:hunter2@host:6379", "scheme 'http'"),
        ("redis://", "names no host"),
        ("redis://:hunter2@host:99999/0", "malformed"),
        ("redis://host:6379/zero", "database number"),
        ("redis+cluster://host:7000/3", "only database 0"),
        ("unix://", "socket path"),
        ("unix:///run/redis.sock?db=one", "one query parameter, the database"),
        ("unix://:hunter2@/run/redis.sock?timeout=1", "one query parameter, the database"),
        ("", "must be a Redis URL"),
    ],
)
def test_a_malformed_url_is_refused_at_construction(url: str, says: str) -> None:
    with pytest.raises(GuardConfigError, match=says) as raised:
        Guard(REPLICAS, fleet=url, name="checkout")
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize("store", [lambda: 6379, lambda: redis.asyncio.Redis(port=1)], ids=["port", "redis_client"])
def test_an_object_that_is_not_a_fleet_store_is_refused_at_construction(store: Callable[[], object]) -> None:
    with pytest.raises(GuardConfigError, match=r"Redis/Valkey URL .* got (int|Redis), which lacks key/run/av"):
        Guard(REPLICAS, fleet=store(), name="checkout")  # type: ignore[arg-type]


def test_fleet_needs_a_valid_name() -> None:
    with pytest.raises(GuardConfigError, match="fleet needs a name"):
        Guard(REPLICAS, fleet="redis://host:6379/0")
    with pytest.raises(GuardConfigError, match="name must be"):
        Guard(REPLICAS, fleet="redis://host:6379/0", name="check out")


def test_accepted_forms() -> None:
    assert not parse_fleet_url("redis://host:6379/0").cluster
    tls = parse_fleet_url("rediss://user:hunter2@host:6380/2")
    assert tls.redacted == "rediss://user:***@host:6380/2" and "hunter2" not in repr(tls)
    cluster = parse_fleet_url("redis+cluster://:pw@node1:7000")
    assert (
        cluster.cluster
        and cluster.url == "redis://:pw@node1:7000"
        and cluster.redacted == "redis+cluster://:***@node1:7000"
    )
    assert parse_fleet_url("unix:///run/redis.sock").url == "unix:///run/redis.sock"


def test_the_database_is_read_and_named_in_the_channels_unless_it_is_0() -> None:
    """Pub/sub ignores the database: fleets of one name on two databases must not hear each other."""
    dbs = {
        u: parse_fleet_url(u).db for u in ("redis://h:6379", "redis://h:6379/0", "rediss://h/5", "redis+cluster://h")
    }
    assert dbs == {"redis://h:6379": 0, "redis://h:6379/0": 0, "rediss://h/5": 5, "redis+cluster://h": 0}
    socket = parse_fleet_url("unix:///run/redis.sock?db=2")
    assert (socket.db, socket.url) == (2, "unix:///run/redis.sock?db=2")
    assert parse_fleet_url("redis://h/0").channel("llmguard:checkout:events") == "llmguard:checkout:events"
    assert socket.channel("llmguard:checkout:events") == "llmguard:checkout:events@db2"


def test_an_unreachable_but_well_formed_url_is_accepted_and_nothing_starts_before_a_call() -> None:
    guard = Guard(REPLICAS, fleet="redis://:hunter2@10.255.255.1:6379/0", name="checkout")
    fleet = guard.snapshot().fleet
    assert fleet is not None and fleet.state == "idle" and fleet.url == "redis://:***@10.255.255.1:6379/0"
    guard.close()


@pytest.fixture
def certificates(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA, and a certificate signed by it (usable by a client) with its key."""
    if OPENSSL is None:
        pytest.skip("openssl is not installed")
    return make_certificates(tmp_path)


def test_a_tls_address_keeps_its_tls_options(certificates: tuple[Path, Path, Path]) -> None:
    ca, cert, key = certificates
    tls = parse_fleet_url(f"rediss://:hunter2@host:6380/0?ssl_ca_certs={ca}&ssl_cert_reqs=required")
    assert tls.url == f"rediss://:hunter2@host:6380/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
    assert tls.redacted == f"rediss://:***@host:6380/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"
    query = f"ssl_check_hostname=false&ssl_certfile={cert}&ssl_keyfile={key}"
    cluster = parse_fleet_url(f"rediss+cluster://node1:7000?{query}")
    assert cluster.cluster and cluster.url == f"rediss://node1:7000?{query}"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://:hunter2@host:6379/0?ssl_ca_certs=/ca.pem", "only a TLS address"),
        ("rediss://:hunter2@host:6380/0?socket_timeout=30", "'socket_timeout'; accepted: ssl_ca_certs"),
        ("rediss://host:6380/0?password=hunter2", "'password'; accepted"),
        ("rediss://:hunter2@host:6380/0?ssl_cert_reqs=maybe", "optional or none"),
        ("rediss://:hunter2@host:6380/0?ssl_ca_certs=", "a CA bundle"),
        ("rediss://:hunter2@host:6380/0?ssl_cert_reqs=none&ssl_cert_reqs=none", "twice"),
        ("rediss://:hunter2@host:6380/0?ssl_ca_certs=/no/such/ca.pem", "'/no/such/ca.pem' is not a file"),
    ],
)
def test_a_query_parameter_that_redis_py_would_not_take_is_refused(url: str, says: str) -> None:
    with pytest.raises(GuardConfigError, match=says) as raised:
        parse_fleet_url(url)
    assert "hunter2" not in str(raised.value)


def test_a_tls_choice_in_any_case_is_passed_on_in_lower_case() -> None:
    """redis-py takes ``ssl_cert_reqs=none`` only: ``NONE`` built a Guard whose store then failed every
    connection ("Invalid SSL Certificate Requirements Flag: NONE")."""
    tls = parse_fleet_url("rediss://:hunter2@host:6380/0?ssl_cert_reqs=NONE&ssl_check_hostname=False")
    assert tls.url == "rediss://:hunter2@host:6380/0?ssl_cert_reqs=none&ssl_check_hostname=false"
    assert tls.redacted == "rediss://:***@host:6380/0?ssl_cert_reqs=none&ssl_check_hostname=false"
    pool = tls.client(socket_timeout=1.0, connect_timeout=1.0).connection_pool  # type: ignore[union-attr]
    assert pool.connection_kwargs["ssl_cert_reqs"] == "none"


def test_a_client_certificate_is_loaded_with_its_key_when_the_guard_is_built(
    certificates: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A key without its certificate, a certificate without its key, or a key of another certificate built a
    Guard whose store then failed every connection; now the Guard is not built, and the error says why."""
    ca, cert, key = certificates
    both = tmp_path / "both.pem"
    both.write_text(cert.read_text() + key.read_text())
    for query, says in [
        (f"ssl_keyfile={key}", "ssl_keyfile without ssl_certfile"),
        (f"ssl_certfile={cert}", "cannot be loaded"),
        (f"ssl_certfile={cert}&ssl_keyfile={tmp_path / 'ca.key'}", "cannot be loaded"),
        (f"ssl_certfile={ca}&ssl_keyfile={key}", "cannot be loaded"),
    ]:
        with pytest.raises(GuardConfigError, match=says) as raised:
            Guard(REPLICAS, fleet=f"rediss://:hunter2@host:6380/0?{query}", name="checkout")
        assert "hunter2" not in str(raised.value)
    assert parse_fleet_url(f"rediss://host:6380/0?ssl_certfile={both}").url.endswith(f"ssl_certfile={both}")


def test_errors_are_masked_whether_the_password_shows_encoded_or_decoded() -> None:
    fleet = parse_fleet_url("redis://:p%40ss%3Aword@host:6379/0")
    assert fleet.password == "p@ss:word"  # what redis-py sends
    text = redact_text("AUTH p@ss:word failed for redis://:p%40ss%3Aword@host:6379/0 (p%40ss%3Aword)", fleet)
    assert "p@ss" not in text and "p%40ss" not in text, text


def test_a_cluster_needs_a_redis_py_with_asyncio_cluster_pub_sub(monkeypatch: pytest.MonkeyPatch) -> None:
    from redis.asyncio.cluster import RedisCluster

    monkeypatch.delattr(RedisCluster, "pubsub")  # what redis-py before 8.0 looks like
    with pytest.raises(GuardConfigError, match=r"redis-py 8.0 or later .* installed: \d"):
        Guard(REPLICAS, fleet="redis+cluster://node1:7000", name="checkout")
    assert not parse_fleet_url("redis://host:6379/0").cluster  # a single server needs no more than before


def test_the_redis_client_is_imported_when_the_guard_is_built_not_on_its_event_loop() -> None:
    """Imported at the first connection, redis-py's asyncio client (~0.1 s to import) held every call on that loop."""
    code = (
        "import sys; from llmguard_client import Guard; assert 'redis.asyncio' not in sys.modules; "
        "Guard(['http://127.0.0.1:9'], fleet='redis://127.0.0.1:1/0', name='checkout'); "
        "assert 'redis.asyncio' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
