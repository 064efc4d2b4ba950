from __future__ import annotations

import email.utils
import http.client
import math
import time

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmguard_client._http.retry_after import RETRY_AFTER_CAP, parse_retry_after

NOW = 1_700_000_000.0  # fixed wall clock for HTTP-date tests


def _date(epoch: float) -> str:
    return email.utils.formatdate(epoch, usegmt=True)


def test_cap_value() -> None:
    assert RETRY_AFTER_CAP == 300.0


def test_no_headers() -> None:
    assert parse_retry_after({}) is None
    assert parse_retry_after({"content-type": "application/json"}) is None
    assert parse_retry_after(httpx.Headers()) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0.0),
        ("1", 1.0),
        ("120", 120.0),
        ("1.5", 1.5),
        (".25", 0.25),
        ("2.", 2.0),
        ("+3", 3.0),
        ("1e2", 100.0),
        ("  7  ", 7.0),
        ("-0", 0.0),
        ("300", 300.0),
        ("300.5", RETRY_AFTER_CAP),
        ("86400", RETRY_AFTER_CAP),
        ("1e308", RETRY_AFTER_CAP),
        ("99999999999999999999999999999999", RETRY_AFTER_CAP),
        ("1e999", RETRY_AFTER_CAP),  # overflow is an excessive delay, not garbage
        ("1e-999", 0.0),
    ],
)
def test_seconds(value: str, expected: float) -> None:
    result = parse_retry_after({"retry-after": value}, now=NOW)
    assert result == expected
    assert result is not None and math.copysign(1.0, result) == 1.0  # never -0.0


@pytest.mark.parametrize(
    "value",
    [
        "",
        " ",
        "\t",
        "garbage",
        "-10",
        "-0.5",
        "-1e999",
        "inf",
        "+inf",
        "-inf",
        "Infinity",
        "nan",
        "NaN",
        "1_000",
        "0x10",
        "5s",
        "5, 6",
        "١٢",
    ],
)
def test_bad_seconds_ignored(value: str) -> None:
    assert parse_retry_after({"retry-after": value}, now=NOW) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0.0),
        ("1500", 1.5),
        ("250.5", 0.2505),
        ("300000", 300.0),
        ("300001", RETRY_AFTER_CAP),
        ("1e999", RETRY_AFTER_CAP),
        ("1_000", 1.0),  # what Python's float reads, as both SDKs read it
        (" 2_500 ", 2.5),
    ],
)
def test_milliseconds_only(value: str, expected: float) -> None:
    assert parse_retry_after({"retry-after-ms": value}, now=NOW) == pytest.approx(expected)


@pytest.mark.parametrize("value", ["", "  ", "garbage", "-10", "inf", "nan", "Infinity"])
def test_bad_milliseconds_alone_is_none(value: str) -> None:
    assert parse_retry_after({"retry-after-ms": value}, now=NOW) is None


def test_milliseconds_win_over_seconds() -> None:
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "30"}, now=NOW) == 0.25
    assert parse_retry_after({"retry-after": _date(NOW + 60), "retry-after-ms": "10"}, now=NOW) == 0.01


@pytest.mark.parametrize("ms", ["", "  ", "garbage", "5, 6", "0x10"])
def test_milliseconds_that_are_no_number_fall_through_to_seconds(ms: str) -> None:
    assert parse_retry_after({"retry-after-ms": ms, "retry-after": "2"}, now=NOW) == 2.0
    assert parse_retry_after({"retry-after-ms": ms, "retry-after": _date(NOW + 42)}, now=NOW) == 42.0


@pytest.mark.parametrize("ms", ["-100", "-10", "-1e999", "inf", "-inf", "Infinity", "nan", " NaN "])
def test_milliseconds_that_are_a_number_but_no_delay_leave_the_backoff_to_the_caller(ms: str) -> None:
    """Both SDKs stop at a ``retry-after-ms`` that reads as a number and, when it is no delay, use their own backoff
    (0.5 s before a first retry): the ``Retry-After`` beside it is not read, by them nor here."""
    assert parse_retry_after({"retry-after-ms": ms, "retry-after": "5"}, now=NOW) is None
    assert parse_retry_after({"retry-after-ms": ms, "retry-after": _date(NOW + 42)}, now=NOW) is None


def test_future_date() -> None:
    assert parse_retry_after({"retry-after": _date(NOW + 30)}, now=NOW) == 30.0
    assert parse_retry_after({"retry-after": _date(NOW + 3600)}, now=NOW) == RETRY_AFTER_CAP
    assert parse_retry_after({"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}, now=NOW) == RETRY_AFTER_CAP


def test_past_date_is_zero() -> None:
    assert parse_retry_after({"retry-after": _date(NOW - 30)}, now=NOW) == 0.0
    assert parse_retry_after({"retry-after": "Sun, 06 Nov 1994 08:49:37 GMT"}, now=NOW) == 0.0


def test_date_fractional_now() -> None:
    assert parse_retry_after({"retry-after": _date(NOW + 10)}, now=NOW + 0.25) == 9.75


@pytest.mark.parametrize(
    "value",
    [
        "Sun, 06 Nov 1994 08:49:37 GMT",  # IMF-fixdate
        "Sunday, 06-Nov-94 08:49:37 GMT",  # obsolete RFC 850
        "Sun Nov  6 08:49:37 1994",  # obsolete asctime, no zone: GMT, never local time
        "Sun, 06 Nov 1994 08:49:37 -0000",
        "Sun, 06 Nov 1994 09:49:37 +0100",
    ],
)
def test_date_formats(value: str) -> None:
    assert parse_retry_after({"retry-after": value}, now=784111777.0 - 5) == 5.0


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="needs time.tzset")
def test_zoneless_dates_are_gmt_not_local_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert parse_retry_after({"retry-after": "Sun Nov  6 08:49:37 1994"}, now=784111777.0 - 5) == 5.0
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    "value",
    [
        "Sun, 06 Nov 1994 25:49:37 GMT",
        "Mon, 32 Feb 2020 00:00:00 GMT",
        "Fri, 31 Dec 99999 23:59:59 GMT",
        "tomorrow",
        "1 2 3 4 5",
    ],
)
def test_bad_dates_ignored(value: str) -> None:
    assert parse_retry_after({"retry-after": value}, now=NOW) is None


def test_default_now_is_wall_clock() -> None:
    result = parse_retry_after({"retry-after": _date(time.time() + 120)})
    assert result is not None and 115.0 <= result <= 120.0


@pytest.mark.parametrize("skew", [-600.0, 600.0], ids=["server-clock-behind", "server-clock-ahead"])
def test_a_date_is_read_on_the_answers_own_clock(skew: float) -> None:
    """A host whose clock is off by minutes waits what the server asked: the date is relative to the answer's
    ``Date``. Before: a server clock 10 minutes behind gave 0 s (retry at once), 10 minutes ahead the 300 s cap."""
    server_now = time.time() + skew
    headers = {"retry-after": _date(server_now + 30), "date": _date(server_now)}
    assert parse_retry_after(headers) == 30.0


def test_an_unreadable_date_header_falls_back_to_the_local_clock() -> None:
    result = parse_retry_after({"retry-after": _date(time.time() + 120), "date": "yesterday"})
    assert result is not None and 115.0 <= result <= 120.0


def test_dict_names_are_case_insensitive() -> None:
    assert parse_retry_after({"Retry-After": "5"}, now=NOW) == 5.0
    assert parse_retry_after({"RETRY-AFTER": "5"}, now=NOW) == 5.0
    assert parse_retry_after({"Retry-After-Ms": "500"}, now=NOW) == 0.5
    assert parse_retry_after({"Retry-After": "30", "RETRY-AFTER-MS": "100"}, now=NOW) == 0.1
    assert parse_retry_after({"Retry-After-MS": "bad", "retry-AFTER": "3"}, now=NOW) == 3.0


def test_httpx_headers() -> None:
    assert parse_retry_after(httpx.Headers({"Retry-After": "5"}), now=NOW) == 5.0
    assert parse_retry_after(httpx.Headers({"Retry-After-Ms": "20", "Retry-After": "5"}), now=NOW) == 0.02
    assert parse_retry_after(httpx.Headers({"retry-after": _date(NOW + 8)}), now=NOW) == 8.0
    response = httpx.Response(429, headers=[("Retry-After", "2.5")])
    assert parse_retry_after(response.headers, now=NOW) == 2.5
    # Duplicated headers are joined with ", " by httpx: not a valid single form.
    assert parse_retry_after(httpx.Headers([("Retry-After", "5"), ("Retry-After", "6")]), now=NOW) is None


@pytest.mark.parametrize("now", [math.nan, math.inf, -math.inf])
def test_now_must_be_finite(now: float) -> None:
    with pytest.raises(ValueError, match="now must be finite"):
        parse_retry_after({"retry-after": "1"}, now=now)


@given(
    ms=st.one_of(st.none(), st.text(max_size=12), st.floats().map(repr)),
    seconds=st.one_of(st.none(), st.text(max_size=40), st.floats().map(repr)),
    now=st.floats(min_value=0, max_value=4e9),
)
def test_result_always_none_or_within_cap(ms: str | None, seconds: str | None, now: float) -> None:
    headers = {k: v for k, v in (("retry-after-ms", ms), ("retry-after", seconds)) if v is not None}
    result = parse_retry_after(headers, now=now)
    assert result is None or 0.0 <= result <= RETRY_AFTER_CAP


@given(st.floats(min_value=0, max_value=RETRY_AFTER_CAP, allow_nan=False))
def test_seconds_round_trip(value: float) -> None:
    assert parse_retry_after({"retry-after": repr(value)}, now=NOW) == value


@pytest.mark.parametrize(
    "headers", [None, "5", b"5", 5, ["retry-after", "5"]], ids=["none", "str", "bytes", "int", "list"]
)
def test_what_is_not_headers_is_a_type_error_naming_what_is_taken(headers: object) -> None:
    """``parse_retry_after(None)`` raised ``AttributeError: 'NoneType' object has no attribute 'get'``."""
    with pytest.raises(TypeError, match=r"takes a response's headers \(httpx.Headers, a dict or another mapping") as e:
        parse_retry_after(headers)  # type: ignore[arg-type]
    assert f"got {type(headers).__name__}: {headers!r}" in str(e.value)


def test_the_standard_librarys_response_headers_are_headers() -> None:
    """``urllib``'s responses carry an ``http.client.HTTPMessage``: ``get`` and ``items``, not a ``Mapping``."""
    message = http.client.HTTPMessage()
    message["Retry-After"] = "7"
    assert parse_retry_after(message) == 7.0  # type: ignore[arg-type]
