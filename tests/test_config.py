"""Configuration values and Guard(...) construction: every bad value is a GuardConfigError naming
the field and what is accepted, raised at construction."""

from __future__ import annotations

import functools
import http
import json
import math
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
import trio

from llmguard_client import (
    BudgetPolicy,
    Bulkhead,
    Guard,
    GuardConfigError,
    HedgePolicy,
    LLMGuardError,
    PhaseRecord,
    Replica,
    RetryPolicy,
    StallTimeout,
    Tier,
    TTFTTimeout,
    UnknownTierError,
)
from tests.virtual import BACKENDS, FakeReplica, Plan, run_virtual, virtual_guard

A = "http://10.0.0.1:8000"
B = "http://10.0.0.2:8000"
BAD_NUMBERS = [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, True, False, "1", None]
BAD_NUMBER_IDS = [
    "zero",
    "zero_float",
    "negative",
    "negative_float",
    "nan",
    "inf",
    "minus_inf",
    "true",
    "false",
    "str",
    "none",
]


def guard(replicas: Any = None, **kwargs: Any) -> Guard:
    kwargs.setdefault("instrumentation", None)
    kwargs.setdefault("transport_factory", lambda r: httpx.MockTransport(lambda q: httpx.Response(200)))
    return Guard([A] if replicas is None else replicas, **kwargs)


def config_error(build: Callable[[], object], *fragments: str) -> GuardConfigError:
    """Assert ``build()`` raises a GuardConfigError (a ValueError) whose message holds every fragment."""
    with pytest.raises(GuardConfigError) as info:
        build()
    error = info.value
    assert isinstance(error, ValueError) and isinstance(error, LLMGuardError)
    message = str(error)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return error


# --- replicas ---------------------------------------------------------------------------------


def test_no_replicas() -> None:
    config_error(lambda: guard([]), "replicas", "at least one base URL")


@pytest.mark.parametrize("replicas", [A, Replica(A), None, 42, {A: 1}], ids=["str", "replica", "none", "int", "dict"])
def test_replicas_must_be_a_list(replicas: Any) -> None:
    config_error(
        lambda: Guard(replicas, instrumentation=None), "replicas must be a list of base URLs or Replica values"
    )


def test_a_string_is_not_split_into_characters() -> None:
    error = config_error(lambda: Guard(A, instrumentation=None), "replicas", "str")
    assert repr(A) in str(error)


def test_a_tuple_of_replicas_is_accepted() -> None:
    g = Guard((A, Replica(B)), instrumentation=None)
    assert [r.url for r in g.replicas] == [A, B]


@pytest.mark.parametrize(
    "second",
    [
        "http://gpu-a.internal:8000",
        "http://gpu-a.internal:8000/",
        "http://gpu-a.internal:8000//",
        "HTTP://gpu-a.internal:8000",
        "http://GPU-A.Internal:8000",
        "http://GPU-A.internal:8000/",
    ],
    ids=["same", "trailing_slash", "double_slash", "scheme_case", "host_case", "host_case_and_slash"],
)
def test_duplicate_replica(second: str) -> None:
    config_error(lambda: guard(["http://gpu-a.internal:8000", second]), "listed twice", "gpu-a.internal:8000")


def test_duplicate_replica_with_a_path_prefix_and_trailing_slash() -> None:
    config_error(lambda: guard(["http://gpu-a.internal:8000/v1", "http://GPU-A.Internal:8000/v1/"]), "listed twice")


def test_duplicate_replica_given_once_as_str_and_once_as_replica() -> None:
    config_error(lambda: guard([A, Replica(A + "/", headers={"authorization": "Bearer x"})]), "listed twice")


def test_duplicate_replica_with_the_default_port_spelled_out() -> None:
    config_error(lambda: guard(["http://h", "http://h:80"]), "listed twice")


def test_same_host_different_ports_or_prefixes_are_distinct() -> None:
    g = guard(["http://h:1", "http://h:2", "http://h:1/v2", "https://h:1"])
    assert len(g.replicas) == 4


@pytest.mark.parametrize(
    "url",
    ["", "10.0.0.1:8000", "localhost", "http://", "http:///path", "//host:1", "http//host", "http://[::1"],
    ids=[
        "empty",
        "no_scheme",
        "bare_host",
        "no_host",
        "no_host_path",
        "scheme_relative",
        "missing_colon",
        "broken_ipv6",
    ],
)
def test_bad_url(url: str) -> None:
    config_error(lambda: Replica(url), "Replica.url", repr(url))


@pytest.mark.parametrize("url", ["ftp://h:21", "ws://h:1", "file:///tmp/x", "unix:///tmp/s"])
def test_non_http_scheme(url: str) -> None:
    config_error(lambda: Replica(url), "Replica.url", "http://", "https://", repr(url))


@pytest.mark.parametrize("url", ["http://h:1/v1?key=secret", "http://h:1?x", "http://h:1/#frag"])
def test_query_or_fragment_in_url(url: str) -> None:
    config_error(lambda: Replica(url), "Replica.url", "must not carry a query or fragment")


@pytest.mark.parametrize("url", [None, 8000, b"http://h:1"])
def test_url_must_be_a_string(url: Any) -> None:
    config_error(lambda: Replica(url), "Replica.url", "non-empty", "http(s)://host")


def test_bad_replica_url_through_guard() -> None:
    config_error(lambda: guard(["ftp://h:1"]), "Replica.url", "'ftp://h:1'")


def test_https_and_path_prefix_are_accepted() -> None:
    r = Replica("https://api.example.com/openai/v1/")
    assert r.name == "https://api.example.com/openai/v1"


def test_port_out_of_range() -> None:
    config_error(lambda: Replica("http://h:99999"), "Replica.url")


def test_replica_name_drops_credentials() -> None:
    r = Replica("http://user:pw@host:1")
    assert "pw" not in r.name and "user" not in r.name and "@" not in r.name
    assert r.name == "http://host:1"
    assert r.url == "http://user:pw@host:1"  # the URL itself is kept for sending


@pytest.mark.parametrize("name", ["Authorization", "authorization"])
def test_replica_url_userinfo_and_an_authorization_header_are_refused_together(name: str) -> None:
    """The URL's ``user:password`` is the replica's ``Authorization``: given beside one in ``headers``, which is meant
    is unclear, so the `Replica` is refused naming both (the password never shown)."""
    error = config_error(
        lambda: Replica("http://user:s3cret@host:1/v1", headers={name: "Bearer k"}), "user:password", repr(name)
    )
    assert "s3cret" not in str(error) and "Bearer k" not in str(error)
    assert Replica("http://user:s3cret@host:1/v1", headers={"api-key": "k"}).headers == {"api-key": "k"}


def test_replica_name_drops_username_only_credentials() -> None:
    assert Replica("https://tok3n@host:443/v1").name == "https://host/v1"


def test_replica_headers_are_copied() -> None:
    headers = {"authorization": "Bearer a"}
    r = Replica(A, headers=headers)
    headers["authorization"] = "Bearer changed"
    assert r.headers == {"authorization": "Bearer a"}


def test_replica_header_values_must_be_strings() -> None:
    config_error(lambda: Replica(A, headers={"x-n": 1}), "Replica.headers")  # type: ignore[dict-item]


@pytest.mark.parametrize("headers", [None, [("x-n", "v")], "x-n: v"], ids=["none", "list", "str"])
def test_replica_headers_must_be_a_mapping(headers: object) -> None:
    """Anything but a mapping is refused naming the type accepted (before: None raised a bare TypeError)."""
    config_error(lambda: Replica(A, headers=headers), "Replica.headers", "mapping", type(headers).__name__)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["bad header", "x:y", "", "x-é", "a\r\nInjected"])
def test_replica_header_names_must_be_http_tokens(name: str) -> None:
    """A name no server takes would fail every call as a local protocol error: refused when it is configured."""
    config_error(lambda: Replica(A, headers={name: "v"}), "Replica.headers", repr(name), "header name", "letters")


@pytest.mark.parametrize(
    ("value", "named"),
    [("v\r\nInjected: 1", "'\\r'"), ("v\ninjected", "'\\n'"), ("v\x00", "'\\x00'")],
    ids=["crlf", "lf", "nul"],
)
def test_replica_header_values_must_not_break_the_line(value: str, named: str) -> None:
    error = config_error(lambda: Replica(A, headers={"authorization": value}), "Replica.headers['authorization']")
    assert "without CR, LF or NUL" in str(error) and named in str(error)
    assert "Injected" not in str(error) and "injected" not in str(error)  # header values are never shown


@pytest.mark.parametrize("value", [" Bearer k", "Bearer k ", "Bearer k\t", "Bearer €"])
def test_replica_header_values_other_servers_refuse(value: str) -> None:
    config_error(lambda: Replica(A, headers={"authorization": value}), "Replica.headers['authorization']")


@pytest.mark.parametrize("name", ["api-key", "Authorization", "x-api-key", "x-goog-api-key"])
def test_replica_credential_header_values_must_not_be_empty(name: str) -> None:
    """An empty credential (an unset environment variable's) would replace the SDK's good key with nothing, failing
    a share of the calls with a 401."""
    error = config_error(lambda: Replica(A, headers={name: ""}), f"Replica.headers[{name!r}]", "is empty")
    assert "non-empty value" in str(error) and "leave the header out" in str(error)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("Content-Length", "frames each request's body"),
        ("transfer-encoding", "frames each request's body"),
        ("Connection", "hop-by-hop"),
        ("keep-alive", "hop-by-hop"),
        ("Proxy-Connection", "hop-by-hop"),
        ("TE", "hop-by-hop"),
        ("upgrade", "hop-by-hop"),
    ],
)
def test_replica_headers_may_not_set_the_requests_framing(name: str, why: str) -> None:
    """A framing or hop-by-hop header is the guard's and its pool's to write: refused when the `Replica` is built,
    naming it and why (a ``Content-Length`` given per replica would misframe every request's body)."""
    config_error(lambda: Replica(A, headers={name: "1"}), f"Replica.headers[{name!r}]", why, "leave it out")


def test_replica_host_header_is_accepted_but_not_empty() -> None:
    assert Replica(A, headers={"Host": "llm.internal"}).headers == {"Host": "llm.internal"}
    config_error(lambda: Replica(A, headers={"host": ""}), "Replica.headers['host']", "is empty")


def test_replica_other_header_values_may_be_empty() -> None:
    """An empty value for another header is sent as it is, as the SDKs send an empty ``default_headers`` value."""
    assert Replica(A, headers={"OpenAI-Organization": "", "x-custom": ""}).headers == {
        "OpenAI-Organization": "",
        "x-custom": "",
    }


def test_replica_header_values_with_inner_spaces_and_tabs_are_accepted() -> None:
    assert Replica(A, headers={"authorization": "Bearer k", "x-t": "a\tb"}).headers["x-t"] == "a\tb"


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1 :8000", "http://host/v 1", "http://host/v1 ", "http://ho st", "http://h\u00a0/v1"]
)
def test_replica_url_with_whitespace(url: str) -> None:
    config_error(lambda: Replica(url), "Replica.url", "must not contain whitespace", repr(url))


# --- Tier ---------------------------------------------------------------------------------------


def test_ttft_greater_than_total() -> None:
    config_error(lambda: Tier(ttft=5, total=2), "Tier.ttft", "Tier.total", "5", "2", "must not exceed")


def test_ttft_equal_to_total_is_accepted() -> None:
    assert Tier(ttft=2, total=2).total == 2


def test_stall_greater_than_total() -> None:
    """A stall limit past the total deadline could never fire: refused like a ttft past it."""
    config_error(lambda: Tier(ttft=1, total=30, stall=60), "Tier.stall", "Tier.total", "60", "30", "must not exceed")


def test_stall_equal_to_total_is_accepted() -> None:
    assert Tier(ttft=1, total=30, stall=30).stall == 30


@pytest.mark.parametrize("field", ["ttft", "total", "stall"])
@pytest.mark.parametrize("value", BAD_NUMBERS, ids=BAD_NUMBER_IDS)
def test_tier_numbers(field: str, value: Any) -> None:
    if field == "stall" and value is None:
        assert Tier(ttft=1, total=2, stall=None).stall is None  # None means "no stall limit"
        return
    if field != "stall" and value is math.inf:  # no deadline: accepted for ttft and total (next test)
        return
    kwargs: dict[str, Any] = {"ttft": 1, "total": 2, "stall": 1}
    kwargs[field] = value
    accepted = "positive finite number of seconds" if field == "stall" else "or math.inf (no deadline)"
    config_error(lambda: Tier(**kwargs), f"Tier.{field}", accepted, repr(value))


def test_a_tier_may_have_no_ttft_or_total_deadline() -> None:
    """``math.inf`` means no deadline (the default tier's); NaN, a negative or -inf are still refused, and a
    first-token deadline past a finite total still is too."""
    assert Tier(ttft=math.inf, total=math.inf) == Tier(math.inf, math.inf, None, None)
    assert Tier(ttft=1.0, total=math.inf, stall=5.0).total == math.inf
    config_error(lambda: Tier(ttft=math.nan, total=math.inf), "Tier.ttft", "or math.inf (no deadline)", "nan")
    config_error(lambda: Tier(ttft=1.0, total=-math.inf), "Tier.total", "or math.inf (no deadline)", "-inf")
    config_error(lambda: Tier(ttft=-1.0, total=math.inf), "Tier.ttft", "or math.inf (no deadline)", "-1.0")
    config_error(lambda: Tier(ttft=math.inf, total=30.0), "Tier.ttft (inf) must not exceed Tier.total (30.0)")
    config_error(lambda: Tier(ttft=1, total=math.inf, stall=math.inf), "Tier.stall", "or None", "inf")


def test_tier_is_frozen() -> None:
    tier = Tier(ttft=1, total=2)
    with pytest.raises(AttributeError):
        tier.ttft = 3  # type: ignore[misc]


# --- policies -----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["delay", "min_delay", "max_delay", "warmup_delay"])
@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, True], ids=["zero", "negative", "nan", "inf", "bool"])
def test_hedge_policy_seconds(field: str, value: Any) -> None:
    config_error(lambda: HedgePolicy(**{field: value}), f"HedgePolicy.{field}", "positive finite number")


def test_hedge_min_delay_above_max_delay() -> None:
    config_error(lambda: HedgePolicy(min_delay=3, max_delay=1), "HedgePolicy.min_delay", "max_delay")


@pytest.mark.parametrize(
    "value", [0, 1, -0.1, 1.5, math.nan, True], ids=["zero", "one", "negative", "above", "nan", "bool"]
)
def test_hedge_quantile(value: Any) -> None:
    config_error(lambda: HedgePolicy(quantile=value), "HedgePolicy.quantile", "(0, 1)")


def test_hedge_non_streaming_is_a_bool() -> None:
    config_error(lambda: HedgePolicy(non_streaming="yes"), "HedgePolicy.non_streaming", "True or False")  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["on_failure", "hedge_all_paths"])
@pytest.mark.parametrize("value", ["no", 0, None], ids=["str", "int", "none"])
def test_hedge_switches_are_bools(field: str, value: Any) -> None:
    """``on_failure="no"`` was taken as on (a truthy str): refused, naming the field and the value."""
    config_error(lambda: HedgePolicy(**{field: value}), f"HedgePolicy.{field}", "True or False", repr(value))


@pytest.mark.parametrize(
    "value", ["/chat/completions", b"/chat/completions", None, 3], ids=["str", "bytes", "none", "int"]
)
def test_hedge_paths_is_a_tuple_of_suffixes(value: Any) -> None:
    """A str (one path, not in a tuple) was taken as its characters' suffixes: refused with an example."""
    config_error(lambda: HedgePolicy(paths=value), "HedgePolicy.paths", "tuple of path suffixes", repr(value))


@pytest.mark.parametrize("value", [("/chat/completions", ""), ("/chat/completions", 3)], ids=["empty", "int"])
def test_hedge_paths_hold_non_empty_strings(value: Any) -> None:
    config_error(lambda: HedgePolicy(paths=value), "HedgePolicy.paths", "non-empty path suffixes", repr(value))


def test_hedge_paths_as_a_list_are_kept_as_a_tuple() -> None:
    policy = HedgePolicy(paths=["/chat/completions"])  # type: ignore[arg-type]
    assert policy.paths == ("/chat/completions",) and hash(policy) == hash(HedgePolicy(paths=("/chat/completions",)))
    assert policy.applies_to("/v1/chat/completions") and not policy.applies_to("/v1/embeddings")


def test_hedge_quantile_of_the_wrong_type() -> None:
    config_error(lambda: HedgePolicy(quantile="0.95"), "HedgePolicy.quantile")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 5, 1.0, -1], ids=["zero", "five", "float", "negative"])
def test_hedge_max_hedges(value: Any) -> None:
    config_error(lambda: HedgePolicy(max_hedges=value), "HedgePolicy.max_hedges", "integer from 1 to 4")


@pytest.mark.parametrize("value", [0, 2.5], ids=["zero", "float"])
def test_hedge_min_samples(value: Any) -> None:
    config_error(lambda: HedgePolicy(min_samples=value), "HedgePolicy.min_samples", "integer >= 1")


@pytest.mark.parametrize("value", [0, 11, 2.0, "3"], ids=["zero", "eleven", "float", "str"])
def test_retry_max_attempts(value: Any) -> None:
    config_error(lambda: RetryPolicy(max_attempts=value), "RetryPolicy.max_attempts", "integer from 1 to 10")


@pytest.mark.parametrize(
    "field", ["backoff_initial", "backoff_max", "circuit_cooldown", "overload_cooldown", "max_retry_after"]
)
@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, False], ids=["zero", "negative", "nan", "inf", "bool"])
def test_retry_policy_seconds(field: str, value: Any) -> None:
    config_error(lambda: RetryPolicy(**{field: value}), f"RetryPolicy.{field}", "positive finite number")


@pytest.mark.parametrize("value", [-1, math.nan, math.inf, False, "0.5"], ids=["negative", "nan", "inf", "bool", "str"])
def test_retry_same_replica_backoff(value: Any) -> None:
    config_error(
        lambda: RetryPolicy(same_replica_backoff=value), "RetryPolicy.same_replica_backoff", "0 (off) or a positive"
    )
    assert RetryPolicy(same_replica_backoff=0).same_replica_backoff == 0


def test_retry_backoff_max_below_backoff_initial() -> None:
    config_error(
        lambda: RetryPolicy(backoff_initial=5.0),
        "RetryPolicy.backoff_max (2.0) must not be below backoff_initial (5.0)",
    )
    assert RetryPolicy(backoff_initial=2.0, backoff_max=2.0).backoff_max == 2.0


@pytest.mark.parametrize("value", [-0.1, 1.5, math.nan, "0.5", True])
def test_retry_policy_panic_threshold(value: Any) -> None:
    config_error(lambda: RetryPolicy(panic_threshold=value), "RetryPolicy.panic_threshold", "from 0 to 1")


@pytest.mark.parametrize("value", [0, -3, 1.5], ids=["zero", "negative", "float"])
def test_retry_circuit_failures(value: Any) -> None:
    config_error(lambda: RetryPolicy(circuit_failures=value), "RetryPolicy.circuit_failures", "integer >= 1")


@pytest.mark.parametrize("statuses", [{400}, {404, 500}, {200}, {600}, {399}], ids=["400", "404", "200", "600", "399"])
def test_retry_statuses(statuses: set[int]) -> None:
    config_error(
        lambda: RetryPolicy(retry_statuses=frozenset(statuses)), "RetryPolicy.retry_statuses", "408, 429 and 5xx"
    )


def test_retry_statuses_accepts_a_set_and_freezes_it() -> None:
    policy = RetryPolicy(retry_statuses={429, 503})  # type: ignore[arg-type]
    assert policy.retry_statuses == frozenset({429, 503}) and isinstance(policy.retry_statuses, frozenset)


@pytest.mark.parametrize(
    "value", [-0.1, 10.5, math.nan, math.inf, True, "0.1"], ids=["negative", "above", "nan", "inf", "bool", "str"]
)
def test_budget_ratio(value: Any) -> None:
    config_error(lambda: BudgetPolicy(ratio=value), "BudgetPolicy.ratio", "from 0 to 10")


@pytest.mark.parametrize("value", [-1, 1.5], ids=["negative", "float"])
def test_budget_floor(value: Any) -> None:
    config_error(lambda: BudgetPolicy(floor=value), "BudgetPolicy.floor", "integer >= 0")


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf], ids=["zero", "negative", "nan", "inf"])
def test_budget_window(value: Any) -> None:
    config_error(lambda: BudgetPolicy(window=value), "BudgetPolicy.window", "positive finite number")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_in_flight": 0}, "Bulkhead.max_in_flight must be an integer >= 1"),
        ({"max_in_flight": 2.0}, "Bulkhead.max_in_flight must be an integer >= 1"),
        ({"max_in_flight": 1, "max_waiting": -1}, "Bulkhead.max_waiting must be an integer >= 0"),
        ({"max_in_flight": 1, "max_waiting": 0.5}, "Bulkhead.max_waiting must be an integer >= 0"),
    ],
    ids=["zero", "float", "negative_waiting", "float_waiting"],
)
def test_bulkhead_numbers(kwargs: dict[str, Any], fragment: str) -> None:
    config_error(lambda: Bulkhead(**kwargs), fragment)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Bulkhead(max_in_flight=True), "Bulkhead.max_in_flight"),
        (lambda: Bulkhead(max_in_flight=1, max_waiting=False), "Bulkhead.max_waiting"),
        (lambda: RetryPolicy(max_attempts=True), "RetryPolicy.max_attempts"),
        (lambda: RetryPolicy(circuit_failures=True), "RetryPolicy.circuit_failures"),
        (lambda: HedgePolicy(max_hedges=True), "HedgePolicy.max_hedges"),
        (lambda: HedgePolicy(min_samples=True), "HedgePolicy.min_samples"),
        (lambda: BudgetPolicy(floor=False), "BudgetPolicy.floor"),
    ],
    ids=["max_in_flight", "max_waiting", "max_attempts", "circuit_failures", "max_hedges", "min_samples", "floor"],
)
def test_bools_are_rejected_as_integers(build: Callable[[], object], field: str) -> None:
    config_error(build, field)


def test_retry_statuses_of_the_wrong_type() -> None:
    config_error(lambda: RetryPolicy(retry_statuses=frozenset({"500"})), "RetryPolicy.retry_statuses")  # type: ignore[arg-type]


# --- Guard(...) -----------------------------------------------------------------------------------


def test_empty_tiers() -> None:
    config_error(lambda: guard(tiers={}), "tiers", "at least one Tier")


@pytest.mark.parametrize(
    ("factory", "got"),
    [
        (lambda r: httpx.HTTPTransport(), "got HTTPTransport for replica 'http://10.0.0.2:8000' (a sync transport"),
        (lambda r: None, "got None for replica 'http://10.0.0.2:8000'"),
        (lambda r: "http://10.0.0.1:8000", "got str for replica"),
    ],
    ids=["sync_transport", "none", "str"],
)
def test_a_transport_factory_building_the_wrong_kind_is_refused_when_the_guard_is_built(
    factory: Callable[[Replica], Any], got: str
) -> None:
    """The Guard calls the factory while it is built: a wrong transport was a raw AttributeError at the first
    call (a Guard that then could not be closed), now a GuardConfigError before any call. The transports built
    for the replicas before the refused one hold no connection."""
    built: list[Any] = []

    def first_good_then(replica: Replica) -> Any:
        transport = httpx.AsyncHTTPTransport() if replica.url == A else factory(replica)
        built.append(transport)
        return transport

    config_error(
        lambda: Guard([A, B], transport_factory=first_good_then, instrumentation=None),
        "transport_factory must be a callable returning an httpx.AsyncBaseTransport",
        got,
    )
    assert len(built) == 2 and not built[0]._pool.connections


def test_an_httpx2_transport_is_refused_when_the_guard_is_built_naming_httpx_s() -> None:
    """httpx2's transport has the methods of an async one, yet takes httpx2 requests: it was taken, then every call
    died on a bare AssertionError inside it, sending nothing."""
    httpx2 = pytest.importorskip("httpx2")
    config_error(
        lambda: Guard([A], transport_factory=lambda replica: httpx2.AsyncHTTPTransport(), instrumentation=None),
        "got httpx2.AsyncHTTPTransport for replica 'http://10.0.0.1:8000'",
        "build the same with httpx, e.g. httpx.AsyncHTTPTransport(uds=...)",
    )


async def test_a_transport_on_httpx2_classes_that_answers_httpx_requests_is_taken() -> None:
    """Only httpx2's pool is refused: its ``MockTransport`` with a handler answering httpx requests serves, as it did
    before httpx2's pool was refused."""
    httpx2 = pytest.importorskip("httpx2")

    async def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"path": request.url.path})

    async with Guard(
        [A], transport_factory=lambda replica: httpx2.MockTransport(answer), instrumentation=None
    ) as built:
        async with built.http_client() as client:
            assert (await client.get(A + "/v1/models")).json() == {"path": "/v1/models"}


@pytest.mark.parametrize("ok", [200, http.HTTPStatus.OK])
async def test_a_transport_answering_httpx2_responses_is_served_through_the_sdk(ok: int) -> None:
    """httpx2's ``MockTransport`` with a handler answering httpx2 responses (an openai 3 test's way) is taken as
    built: each call failed on a bare AssertionError inside the guard (served under ``python -O``, which drops it)."""
    httpx2 = pytest.importorskip("httpx2")
    openai = pytest.importorskip("openai")
    answered: list[bool] = []

    def answer(request: httpx.Request) -> Any:
        streamed = json.loads(request.content).get("stream", False)
        answered.append(streamed)
        if not streamed:
            message = {"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}
            return httpx2.Response(
                ok, json={"id": "c", "object": "chat.completion", "model": "m", "choices": [message]}
            )
        chunks = [
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "model": "m",
                "choices": [{"index": 0, "delta": {"content": t}}],
            }
            for t in ("hel", "lo")
        ]
        events = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks) + b"data: [DONE]\n\n"
        return httpx2.Response(ok, headers={"content-type": "text/event-stream"}, content=events)

    mock = httpx2.MockTransport(answer)
    async with Guard([A], transport_factory=lambda replica: mock, instrumentation=None) as built:
        client = openai.AsyncOpenAI(
            base_url=A + "/v1", api_key="k", http_client=built.http_client_for(openai.AsyncOpenAI)
        )
        whole = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        chunks = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        streamed = "".join([chunk.choices[0].delta.content or "" async for chunk in chunks if chunk.choices])
    assert (whole.choices[0].message.content, streamed, answered) == ("hello", "hello", [False, True])


async def test_a_transport_answering_a_sync_body_fails_its_call_with_a_type_error_naming_what_is_accepted() -> None:
    """``httpx.MockTransport`` whose handler answers ``content=`` a sync iterator, which only a sync client reads:
    the call fails at once, saying what body the guard reads (it failed on a bare AssertionError)."""
    answered: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        answered.append(request.url.path)
        return httpx.Response(200, content=iter([b'{"ok": true}']))

    async with Guard([A], transport_factory=lambda replica: httpx.MockTransport(answer), instrumentation=None) as built:
        async with built.http_client() as client:
            with pytest.raises(TypeError) as refused:
                await client.get(A + "/v1/models")
    assert str(refused.value).startswith("a transport from transport_factory answered httpx.Response with httpx.")
    assert "bytes or an async iterator" in str(refused.value) and "not a sync iterator" in str(refused.value)
    assert answered == ["/v1/models"]  # once: the guard sent it no retry


async def test_a_transport_that_serves_as_an_async_one_is_taken() -> None:
    """A factory may build its own kind of transport (``handle_async_request`` and ``aclose``, no httpx base
    class), as it could before the factory's transports were checked."""

    class Answers:
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json={"ok": True})

        async def aclose(self) -> None:
            pass

    async with Guard([A], transport_factory=lambda replica: Answers(), instrumentation=None) as built:  # type: ignore[arg-type, return-value]
        async with built.http_client() as client:
            assert (await client.get(A + "/v1/models")).json() == {"ok": True}


def test_a_transport_instance_given_as_the_factory_is_refused() -> None:
    config_error(
        lambda: guard(transport_factory=httpx.AsyncHTTPTransport()),
        "transport_factory must be a callable returning an httpx.AsyncBaseTransport",
        "got an AsyncHTTPTransport instance; pass a function, e.g. lambda replica:",
    )


class _TwoArguments:
    def __call__(self, replica: Replica, limits: httpx.Limits) -> httpx.AsyncBaseTransport:
        return httpx.AsyncHTTPTransport(limits=limits)


@pytest.mark.parametrize(
    ("factory", "takes"),
    [(lambda: httpx.AsyncHTTPTransport(), "which takes ()"), (_TwoArguments(), "which takes (replica, limits)")],
    ids=["no_argument", "two_arguments"],
)
def test_a_transport_factory_not_taking_one_replica_is_refused_naming_its_signature(
    factory: Callable[..., Any], takes: str
) -> None:
    """``Guard(transport_factory=lambda: transport)`` raised a raw ``TypeError: <lambda>() takes 0 positional
    arguments but 1 was given`` from inside the Guard."""
    config_error(
        lambda: guard(transport_factory=factory),
        "transport_factory must take one argument, the Replica to build a transport for",
        "factory(replica) -> httpx.AsyncBaseTransport",
        takes,
    )


def test_a_transport_factory_taking_the_replica_in_any_form_is_taken() -> None:
    """A class, a partial, a function with ``*args`` or defaults: what can be called with the replica is taken."""

    class Transport(httpx.AsyncHTTPTransport):
        def __init__(self, replica: Replica) -> None:
            super().__init__()

    def loose(*args: Any, retries: int = 0) -> httpx.AsyncBaseTransport:
        return httpx.AsyncHTTPTransport(retries=retries)

    def keyed(replica: Replica, *, retries: int) -> httpx.AsyncBaseTransport:
        return httpx.AsyncHTTPTransport(retries=retries)

    for factory in (Transport, loose, functools.partial(keyed, retries=1)):
        guard(transport_factory=factory).close()


def test_pool_limits_without_room_for_one_connection_are_refused() -> None:
    """``httpx.Limits(max_connections=0)`` was accepted; every call then waited out its ttft for a connection."""
    config_error(
        lambda: guard(pool_limits=httpx.Limits(max_connections=0)),
        "pool_limits.max_connections must be at least 1 (or None: no limit), got 0",
    )


def test_pool_limits_of_httpx2_are_refused_naming_the_module() -> None:
    """openai 3.x hands out httpx2 clients, whose ``Limits`` prints as httpx's does: the error names both."""
    httpx2 = pytest.importorskip("httpx2")
    config_error(
        lambda: guard(pool_limits=httpx2.Limits(max_connections=3)),
        "pool_limits must be an httpx.Limits(...) (the guard's pools are httpx's",
        "got httpx2.",
    )


@pytest.mark.parametrize("clock", [1.0, "monotonic", 0], ids=["float", "str", "int"])
def test_a_clock_that_is_not_callable_is_refused(clock: Any) -> None:
    """``Guard(clock=1.0)`` was accepted, then every call raised ``TypeError: 'float' object is not callable``."""
    config_error(lambda: guard(clock=clock), "clock must be a callable", "time.monotonic", repr(clock))


def test_a_clock_taking_an_argument_is_refused_when_the_guard_is_built() -> None:
    """A clock taking an argument was taken: every call then raised a raw TypeError from deep inside the guard."""
    config_error(
        lambda: guard(clock=lambda now: 1.0),
        "clock must be a callable taking no argument and returning the current time in seconds",
        "time.monotonic",
        "which takes (now)",
    )


def test_a_clock_is_not_read_when_the_guard_is_built() -> None:
    """``clock=trio.current_time`` raises outside trio's run, and a clock reading ``asyncio.get_event_loop()``
    outside a loop creates one: the Guard may be built before its loop runs, so only the calls read the clock."""
    reads: list[float] = []
    guard(clock=lambda: reads.append(1.0) or 1.0).close()
    guard(clock=trio.current_time).close()
    assert reads == []


@pytest.mark.parametrize("tiers", [{"x": None}, {"x": 1.0}, {"": Tier(1, 2)}, {"  ": Tier(1, 2)}, {1: Tier(1, 2)}])
def test_tiers_must_map_names_to_tiers(tiers: Any) -> None:
    config_error(lambda: guard(tiers=tiers), "tiers must map non-empty names to Tier values")


def test_unknown_default_tier() -> None:
    tiers = {"fast": Tier(1, 2), "slow": Tier(5, 10)}
    error = config_error(lambda: guard(tiers=tiers, default_tier="medium"), "default_tier", "'medium'", "fast, slow")
    assert isinstance(error, UnknownTierError)


def test_default_tier_defaults_to_the_first_tier() -> None:
    g = guard(tiers={"slow": Tier(5, 10), "fast": Tier(1, 2)})
    assert g.default_tier == "slow"


def test_bulkheads_naming_unknown_tiers() -> None:
    tiers = {"fast": Tier(1, 2), "slow": Tier(5, 10)}
    error = config_error(
        lambda: guard(tiers=tiers, bulkheads={"fast": Bulkhead(1), "batch": Bulkhead(2)}),
        "bulkheads",
        "'batch'",
        "fast, slow",
    )
    assert isinstance(error, UnknownTierError)


def test_bulkhead_values_must_be_bulkheads() -> None:
    config_error(lambda: guard(bulkheads={"interactive": 2}), "bulkheads", "Bulkhead")


@pytest.mark.parametrize("mode", ["retry", "RAISE", "", None, True], ids=["other", "upper", "empty", "none", "bool"])
def test_bad_failure_mode(mode: Any) -> None:
    config_error(lambda: guard(failure_mode=mode), "failure_mode", "'auto', 'response' or 'raise'", repr(mode))


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [
        ("hedge", RetryPolicy(), "HedgePolicy"),
        ("hedge", {"delay": 0.1}, "HedgePolicy"),
        ("retry", HedgePolicy(), "RetryPolicy"),
        ("retry", 3, "RetryPolicy"),
        ("budget", 0.1, "BudgetPolicy"),
        ("budget", RetryPolicy(), "BudgetPolicy"),
    ],
    ids=["hedge_retrypolicy", "hedge_dict", "retry_hedgepolicy", "retry_int", "budget_float", "budget_retrypolicy"],
)
def test_wrong_policy_types(field: str, value: Any, kind: str) -> None:
    config_error(lambda: guard([A, B], **{field: value}), field, f"a {kind} or None")


@pytest.mark.parametrize("on_record", ["records.jsonl", 5], ids=["path", "int"])
def test_on_record_must_be_callable(on_record: Any) -> None:
    config_error(lambda: guard(on_record=on_record), "on_record must be None or a callable", repr(on_record))


class _HalfInstrumentation:
    def call_started(self, record: object) -> None: ...


@pytest.mark.parametrize(
    ("instrumentation", "lacks"),
    [(5, "call_started, replica_cooled, bulkhead_rejected, register_budget"), (_HalfInstrumentation(), "replica_")],
    ids=["int", "half"],
)
def test_instrumentation_must_implement_the_protocol(instrumentation: Any, lacks: str) -> None:
    config_error(lambda: guard(instrumentation=instrumentation), "must implement", f"which lacks {lacks}")


def test_policies_may_be_switched_off() -> None:
    g = guard([A, B], hedge=None, retry=None, budget=None)
    assert (g.hedge_policy, g.retry_policy, g.budget) == (None, None, None)


def test_hedging_is_on_by_default_only_with_two_replicas() -> None:
    assert guard([A]).hedge_policy is None
    assert isinstance(guard([A, B]).hedge_policy, HedgePolicy)


@pytest.mark.parametrize(
    "rollout",
    [-0.1, 1.01, math.nan, math.inf, True, "0.5", None],
    ids=["negative", "above", "nan", "inf", "bool", "str", "none"],
)
def test_rollout_outside_zero_one(rollout: Any) -> None:
    config_error(lambda: guard(rollout=rollout), "rollout", "from 0.0 to 1.0", repr(rollout))


@pytest.mark.parametrize("rollout", [0, 0.0, 0.5, 1, 1.0])
def test_rollout_bounds_are_accepted(rollout: float) -> None:
    guard(rollout=rollout)


def test_guard_tier_context_with_unknown_tier() -> None:
    g = guard(tiers={"fast": Tier(1, 2)})
    with pytest.raises(UnknownTierError, match=r"'slow'.*fast"), g.tier("slow"):
        pass


def test_a_valid_guard_keeps_its_configuration() -> None:
    tiers = {"fast": Tier(1, 2, stall=0.5), "slow": Tier(5, 10)}
    g = guard([A, Replica(B, headers={"authorization": "Bearer b"})], tiers=tiers, default_tier="slow")
    assert [r.name for r in g.replicas] == [A, B]
    assert dict(g.tiers) == tiers and g.default_tier == "slow"


def test_a_replica_is_hashable_and_equal_replicas_hash_alike() -> None:
    keyed = Replica("http://a.test", headers={"authorization": "Bearer k"})
    same = Replica("http://a.test", headers={"authorization": "Bearer k"})
    other = Replica("http://a.test", headers={"authorization": "Bearer other"})
    assert keyed == same and hash(keyed) == hash(same) and keyed != other
    assert len({keyed, same, other, Replica("http://a.test")}) == 3
    assert {keyed: "primary"}[same] == "primary"


def test_affinity_takes_auto_explicit_a_policy_or_none_and_names_what_is_accepted() -> None:
    from llmguard_client._routing.affinity.routing import resolve_affinity
    from llmguard_client.config import AffinityPolicy

    assert resolve_affinity("auto") == AffinityPolicy()
    assert resolve_affinity("explicit") == AffinityPolicy(auto=False)
    assert resolve_affinity(None) is None
    policy = AffinityPolicy(load_factor=2.0, load_slack=0)
    assert resolve_affinity(policy) is policy
    with pytest.raises(GuardConfigError, match=r"affinity must be 'auto'.*got 'sticky'"):
        resolve_affinity("sticky")
    with pytest.raises(GuardConfigError, match="load_factor must be a finite number >= 1"):
        AffinityPolicy(load_factor=0.5)
    with pytest.raises(GuardConfigError, match="load_slack must be an integer >= 0"):
        AffinityPolicy(load_slack=-1)
    with pytest.raises(GuardConfigError, match="auto must be True or False"):
        AffinityPolicy(auto="yes")  # type: ignore[arg-type]


def slow_replica(seconds: float) -> Callable[[Replica], httpx.AsyncBaseTransport]:
    """Replicas that answer a non-streaming chat completion after ``seconds`` (of the event loop's clock)."""

    def factory(replica: Replica) -> httpx.AsyncBaseTransport:
        async def handle(request: httpx.Request) -> httpx.Response:
            await anyio.sleep(seconds)
            return httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": "done"}}]})

        return httpx.MockTransport(handle)

    return factory


@BACKENDS
def test_a_call_that_names_no_tier_waits_as_the_sdk_would_and_interactive_is_there_to_choose(backend: str) -> None:
    """The default tier cuts no answer the plain SDK waits for (10 s here; its read timeout is 600 s); the
    built-in interactive tier, chosen per call, bounds the same answer at 2 s."""

    async def main() -> None:
        async with Guard([A, B], transport_factory=slow_replica(10.0), instrumentation=None) as g:
            assert g.default_tier == "default"
            async with g.http_client() as client:
                start = anyio.current_time()
                answered = await client.post(A + "/v1/chat/completions", json={"model": "m"})
                assert answered.status_code == 200 and anyio.current_time() - start == pytest.approx(10.0, abs=0.01)
                start = anyio.current_time()
                with pytest.raises(TTFTTimeout):
                    await client.post(
                        A + "/v1/chat/completions", json={"model": "m"}, headers={"x-llmguard-tier": "interactive"}
                    )
                assert anyio.current_time() - start == pytest.approx(2.0, abs=0.01)

    run_virtual(main, backend)


CHAT = A + "/v1/chat/completions"


async def read_stream(client: httpx.AsyncClient, **kwargs: Any) -> tuple[int, str]:
    """A streamed chat call read to its end: (status, the content tokens' text)."""
    text = ""
    async with client.stream("POST", CHAT, json={"model": "m", "stream": True}, **kwargs) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["delta"].get("content", "")
    return response.status_code, text


@BACKENDS
def test_the_default_tier_serves_a_model_that_thinks_for_20_minutes_behind_keep_alives(backend: str) -> None:
    """A reasoning model behind a gateway that sends an SSE comment every 10 s while it thinks: each read is well
    within the SDK's 600 s read timeout, so the plain SDK is served after 1200 s, and so is a guarded call that
    names no tier (it was cut at the default tier's 600 s ttft, with `TTFTTimeout`)."""

    async def main() -> None:
        fake = FakeReplica("a", [Plan(first_token_after=1200.0, keepalive_every=10.0, tokens=3)])
        records: list[PhaseRecord] = []
        async with virtual_guard({A: fake}, records) as g, g.http_client() as client:
            start = anyio.current_time()
            assert await read_stream(client) == (200, "a0 a1 a2 ")
            assert anyio.current_time() - start == pytest.approx(1200.0, abs=0.01)
        assert [r.status for r in records] == ["ok"] and records[0].tier == "default"

    run_virtual(main, backend)


@BACKENDS
def test_the_default_tier_serves_a_whole_answer_that_takes_longer_than_600_s(backend: str) -> None:
    """OpenAI's flex processing: ``timeout=900`` on the client and an answer without a stream after 620 s. The plain
    SDK is served; so is a guarded call in the default tier (it failed at 600 s)."""

    async def main() -> None:
        fake = FakeReplica("a", [Plan(first_token_after=620.0, stream=False)])
        records: list[PhaseRecord] = []
        async with virtual_guard({A: fake}, records) as g, g.http_client(timeout=900.0) as client:
            answered = await client.post(CHAT, json={"model": "m"})
        assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"] == "a"
        assert [r.status for r in records] == ["ok"] and fake.requests == 1

    run_virtual(main, backend)


@BACKENDS
def test_the_default_tier_serves_a_stream_longer_than_an_hour(backend: str) -> None:
    """One token every 300 s for 75 minutes: no read is near the SDK's read timeout, and the default tier has no
    total deadline (it ended such a stream with `TotalTimeout` at 3600 s)."""

    async def main() -> None:
        fake = FakeReplica("a", [Plan(tokens=16, gap=300.0)])
        records: list[PhaseRecord] = []
        async with virtual_guard({A: fake}, records) as g, g.http_client() as client:
            start = anyio.current_time()
            status, text = await read_stream(client)
            assert anyio.current_time() - start == pytest.approx(4500.0, abs=0.01)
        assert status == 200 and text == "".join(f"a{i} " for i in range(16)) and [r.status for r in records] == ["ok"]

    run_virtual(main, backend)


@BACKENDS
def test_after_the_first_token_the_default_tier_is_bounded_by_the_clients_read_timeout(backend: str) -> None:
    """After the first token the client's read timeout is the default tier's stall limit, as it bounds the plain
    SDK's reads: a 700 s silence is served with ``timeout=900`` (the guard cut it at 600 s) and cut at 600 s with
    the SDKs' default 600 s."""

    async def main() -> None:
        fake = FakeReplica("a", [Plan(tokens=2, gap=700.0)])
        records: list[PhaseRecord] = []
        async with virtual_guard({A: fake}, records) as g, g.http_client() as client:
            assert await read_stream(client, timeout=900.0) == (200, "a0 a1 ")
            start = anyio.current_time()
            with pytest.raises(StallTimeout):
                await read_stream(client)
            assert anyio.current_time() - start == pytest.approx(600.0, abs=0.01)
        assert [r.status for r in records] == ["ok", "timeout"]

    run_virtual(main, backend)


@pytest.mark.parametrize(
    "url",
    [
        "http://user:s3cret@host:8000/v1?x=1",
        "http://user:s3cret@host:8000/v1#frag",
        "ftp://user:s3cret@host/v1",
        "http://user:s3cret@host:99999/v1",
        "http://user:s3cret@host /v1",
        "http://user:s3cret@[::1/v1",
    ],
    ids=["query", "fragment", "scheme", "port", "whitespace", "invalid"],
)
def test_a_refused_replica_url_is_quoted_without_its_password(url: str) -> None:
    """Startup errors end up in logs and error trackers: the URL they quote has its userinfo masked."""
    with pytest.raises(GuardConfigError) as caught:
        Replica(url)
    assert "s3cret" not in str(caught.value) and "user" not in str(caught.value)
    assert "//***@" in str(caught.value)


def test_a_url_given_where_a_list_was_expected_is_quoted_without_its_password() -> None:
    error = config_error(lambda: Guard("http://user:s3cret@host/v1", instrumentation=None), "replicas", "str")
    assert "s3cret" not in str(error) and "'http://***@host/v1'" in str(error)


@pytest.mark.parametrize(
    "url",
    [
        "https://host/openai?api-key=s3cret&api-version=1",
        "https://host/v1?sig=s3cret",
        "https://host?Key=s3cret#frag",
        "https://host/api?code=s3cret",
        "https://host/v1?subscription-key=s3cret",
        "https://host/v1?X-Amz-Credential=s3cret&X-Amz-Signature=s3cret",
    ],
    ids=["azure-key", "sas-signature", "key-and-fragment", "functions-code", "apim-key", "aws-presigned"],
)
def test_a_refused_replica_url_is_quoted_without_the_keys_in_its_query(url: str) -> None:
    """A key pasted into the URL's query (Azure's ``api-key``, a SAS ``sig``) is masked as the userinfo is."""
    with pytest.raises(GuardConfigError, match="must not carry a query") as caught:
        Replica(url)
    assert "s3cret" not in str(caught.value) and "=***" in str(caught.value)
