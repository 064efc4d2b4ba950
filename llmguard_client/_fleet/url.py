"""A fleet store's address: checked when the Guard is built, redacted wherever it is shown.

Accepted: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS), ``unix:///path.sock[?db=N]``, and
``redis+cluster://`` / ``rediss+cluster://`` for a Redis Cluster (any one node; the client discovers the
others). Valkey speaks the same protocol: use the same schemes. A TLS address may carry redis-py's TLS options
as query parameters (`TLS_OPTIONS`), e.g. ``rediss://host:6380/0?ssl_ca_certs=/etc/redis/ca.pem``. A malformed
address is a `GuardConfigError` at construction; one that is well formed but unreachable fails open at run time.
A TLS option is checked as redis-py will use it: a choice in any case is passed on in lower case (redis-py takes
``none`` only), and a client certificate is loaded with its key, so that neither fails every connection later.

Redis pub/sub ignores the database number: `FleetURL.channel` puts it in the fleet's channel names, so that fleets
of one name on two databases of one Redis (staging and production) do not hear each other's events.
"""

from __future__ import annotations

import importlib.util
import os
import re
import ssl
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmguard_client._core.redact import MASK
from llmguard_client.errors import GuardConfigError

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

__all__ = ["TLS_OPTIONS", "FleetURL", "check_name", "parse_fleet_url"]

SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
TLS_OPTIONS = {
    "ssl_ca_certs": "a CA bundle (PEM) to verify the server with, instead of the system's",
    "ssl_cert_reqs": "required (the default), optional or none (in any case)",
    "ssl_check_hostname": "true (the default) or false",
    "ssl_certfile": "a client certificate (PEM), for servers that require one, with its key in ssl_keyfile or in it",
    "ssl_keyfile": "the private key (PEM, unencrypted) of the client certificate in ssl_certfile",
}
"""The query parameters a ``rediss://`` address may carry: redis-py's TLS options that both its `Redis` and its
`RedisCluster` accept. Anything else (a timeout, a password) is refused: the store sets its own timeouts, and a
password belongs in the address's userinfo, where it is masked."""
_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_CHOICES = {
    "ssl_cert_reqs": ("required", "optional", "none"),
    "ssl_check_hostname": ("true", "false"),
}


@dataclass(frozen=True, slots=True)
class FleetURL:
    """A checked fleet address (`parse_fleet_url`)."""

    url: str
    """The address as given, with ``+cluster`` removed (what redis-py reads); it may hold a password."""
    cluster: bool
    redacted: str
    """The address with its password masked: the only form that is ever logged or shown."""
    password: str | None
    db: int = 0
    """The database number (a cluster's is 0)."""

    def channel(self, name: str) -> str:
        """The pub/sub channel for ``name`` (a key-like name, `FleetStore.key`) on this address's database:
        ``name`` itself on database 0, ``name@db{N}`` on database N."""
        return name if self.db == 0 else f"{name}@db{self.db}"

    def __repr__(self) -> str:
        return f"FleetURL({self.redacted!r}, cluster={self.cluster})"

    def client(self, *, socket_timeout: float, connect_timeout: float) -> Redis | RedisCluster:
        """A redis-py asyncio client for this address, without retries of its own: the store decides."""
        from redis.asyncio import Redis
        from redis.asyncio.cluster import RedisCluster
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        options = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        if self.cluster:
            return RedisCluster.from_url(self.url, **options)
        return Redis.from_url(self.url, **options)  # type: ignore[arg-type]


def parse_fleet_url(url: object) -> FleetURL:
    """``url`` checked (see the module docstring), or a `GuardConfigError` naming what is wrong."""
    accepted = "redis://host:6379/0, rediss://:password@host:6380/0, unix:///path.sock or redis+cluster://host:7000"
    if not isinstance(url, str) or not url.strip():
        raise GuardConfigError(f"fleet must be a Redis URL such as {accepted}; got {url!r}")
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise GuardConfigError(f"fleet URL {_redact_raw(url)!r} is malformed ({exc}); expected {accepted}") from None
    scheme = parts.scheme.lower()
    shown = _redact_raw(url)
    if scheme not in SCHEMES:
        raise GuardConfigError(
            f"fleet URL {shown!r} has scheme {parts.scheme!r}; accepted: {', '.join(SCHEMES)} (e.g. {accepted})"
        )
    cluster = scheme.endswith("+cluster")
    db = ""
    if scheme == "unix":
        if not parts.path:
            raise GuardConfigError(f"fleet URL {shown!r} names no socket path; expected unix:///path/to/redis.sock")
    else:
        if not parts.hostname:
            raise GuardConfigError(f"fleet URL {shown!r} names no host; expected e.g. {accepted}")
        if port == 0:
            raise GuardConfigError(f"fleet URL {shown!r} has port 0; expected a port from 1 to 65535")
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise GuardConfigError(f"fleet URL {shown!r}: the path must be a database number such as /0, got /{db}")
        if cluster and db not in ("", "0"):
            raise GuardConfigError(f"fleet URL {shown!r}: Redis Cluster has only database 0, got /{db}")
    _check_query(parts.query, scheme, shown)
    if scheme == "unix":
        db = dict(urllib.parse.parse_qsl(parts.query)).get("db", "")
    plain = url.strip()
    if (query := _lowered_choices(parts.query)) != parts.query:
        plain, shown = (text.replace("?" + parts.query, "?" + query, 1) for text in (plain, shown))
    if cluster:
        plain = scheme.replace("+cluster", "") + plain[len(parts.scheme) :]
    _check_client(cluster)
    password = urllib.parse.unquote(parts.password) if parts.password else None
    return FleetURL(plain, cluster, shown, password, int(db or 0))


def _check_client(cluster: bool) -> None:
    """redis-py is installed, and for a cluster recent enough: its asyncio `RedisCluster` has pub/sub only
    from redis-py 8.0 (before, the store could never connect). Its asyncio client is imported here, when the
    Guard is built: imported at the first connection, on the event loop, it held every call there for ~0.1 s."""
    if importlib.util.find_spec("redis") is None:
        raise GuardConfigError(
            "fleet needs redis-py, the [fleet] extra: pip install 'llmguard-client[fleet]' "
            "(pip install -e '.[fleet]' in a checkout)"
        )
    import redis.asyncio

    if cluster:
        from redis.asyncio.cluster import RedisCluster

        if not hasattr(RedisCluster, "pubsub"):
            raise GuardConfigError(
                f"a Redis Cluster fleet needs redis-py 8.0 or later (its asyncio RedisCluster has pub/sub from "
                f"8.0 on); installed: {redis.__version__}. pip install 'redis>=8'"
            )


def _check_query(query: str, scheme: str, shown: str) -> None:
    """The address's query parameters: TLS options on a TLS address only (`TLS_OPTIONS`), the database on a
    Unix socket's (``?db=N``: its path is the socket's)."""
    if not query:
        return
    accepted = ", ".join(TLS_OPTIONS)
    if scheme == "unix":
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        if len(pairs) != 1 or pairs[0][0] != "db" or not pairs[0][1].isdigit():
            raise GuardConfigError(
                f"fleet URL {shown!r}: a unix:// address takes one query parameter, the database: ?db=0, ?db=1..."
            )
        return
    if not scheme.startswith("rediss"):
        raise GuardConfigError(
            f"fleet URL {shown!r} has query parameters; only a TLS address (rediss://, rediss+cluster://) takes "
            f"any, and only these: {accepted}"
        )
    seen: set[str] = set()
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        if name not in TLS_OPTIONS:
            raise GuardConfigError(f"fleet URL {shown!r} has the query parameter {name!r}; accepted: {accepted}")
        if name in seen:
            raise GuardConfigError(f"fleet URL {shown!r} gives {name!r} twice")
        seen.add(name)
        choices = _CHOICES.get(name)
        if (choices is not None and value.lower() not in choices) or not value:
            raise GuardConfigError(f"fleet URL {shown!r}: {name}={value!r}; expected {TLS_OPTIONS[name]}")
        if name in _FILES and not os.path.isfile(value):
            raise GuardConfigError(f"fleet URL {shown!r}: {name}={value!r} is not a file; expected {TLS_OPTIONS[name]}")
    options = dict(urllib.parse.parse_qsl(query))
    _check_client_certificate(options.get("ssl_certfile"), options.get("ssl_keyfile"), shown)


def _lowered_choices(query: str) -> str:
    """``query`` with each choice's value (`_CHOICES`) in lower case, the rest as written: redis-py takes
    ``ssl_cert_reqs=none`` only, and ``NONE`` failed every connection ("Invalid SSL Certificate Requirements
    Flag")."""
    pieces = []
    for piece in query.split("&"):
        name, eq, value = piece.partition("=")
        pieces.append(name + eq + (value.lower() if name in _CHOICES else value))
    return "&".join(pieces)


def _check_client_certificate(certfile: str | None, keyfile: str | None, shown: str) -> None:
    """The client certificate and its key, loaded as the TLS connection will load them: a key without its
    certificate, a certificate whose key is neither given nor in its file, a key of another certificate or an
    encrypted key (redis-py would ask for its passphrase on the terminal) failed every connection."""
    if certfile is None and keyfile is None:
        return
    if certfile is None:
        raise GuardConfigError(
            f"fleet URL {shown!r}: ssl_keyfile without ssl_certfile; give the client certificate (PEM) it is the "
            "key of as ssl_certfile"
        )
    try:
        ssl.create_default_context().load_cert_chain(certfile, keyfile, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        given = f"ssl_certfile={certfile!r}" + (f" with ssl_keyfile={keyfile!r}" if keyfile else "")
        raise GuardConfigError(
            f"fleet URL {shown!r}: {given} cannot be loaded ({exc}); expected a client certificate (PEM) and its "
            "unencrypted private key (PEM), as ssl_keyfile or in the certificate's file"
        ) from None


def check_name(name: object) -> str:
    """The Guard's ``name`` (it namespaces every fleet key), or a `GuardConfigError`."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise GuardConfigError(
            "name must be 1-64 characters of letters, digits, '_', '.' or '-', starting with a letter or digit "
            f"(e.g. 'checkout'); it namespaces the fleet's keys; got {name!r}"
        )
    return name


_SECRET_QUERY = re.compile(r"([?&][^=&#]*password=)[^&#]*", re.IGNORECASE)


def _redact_raw(url: str) -> str:
    """``url`` with any userinfo (and any ``...password=`` query value) masked, without trusting it to parse."""
    url = _SECRET_QUERY.sub(lambda m: m.group(1) + MASK, url)
    head, sep, rest = url.strip().partition("://")
    if not sep:
        return url if "@" not in url else MASK
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url.strip()
    user = userinfo.split(":", 1)[0]
    masked = f"{user}:{MASK}" if ":" in userinfo else MASK
    return f"{head}://{masked}@{host}"


def redact_text(text: str, fleet: FleetURL) -> str:
    """An error message with the fleet's password, if any, masked (redis-py may echo parts of the URL)."""
    text = text.replace(fleet.url, fleet.redacted)
    if fleet.password:
        raw = urllib.parse.urlsplit(fleet.url).password or ""
        for form in sorted({fleet.password, raw, urllib.parse.quote(fleet.password, safe="")} - {""}, key=len)[::-1]:
            text = text.replace(form, MASK)
    return text
