"""The rate-limit headers of each provider's form: the room they report, the reset they give, whether room is left.

OpenAI's form and its durations, the same with a window (Mistral, Cerebras), Anthropic's, the unsuffixed form
(Together, OpenRouter), the IETF draft's, repeated headers, and a 429 refusing a request for its own size.
"""

from __future__ import annotations

import httpx
import pytest

from llmguard_client._ratelimit.headers import MAX_RESET, parse_duration, parse_rate_limits, remaining_room, room_left

DATE = "Sun, 06 Dec 2026 03:44:48 GMT"
"""The answer's time (its ``Date``): resets given as a time are read against it."""


def anthropic(requests: int, tokens: int, output: int = 79_000, reset: str = "2026-12-06T03:44:58Z") -> httpx.Headers:
    """Anthropic's headers as its API sends them, every reset ``reset``."""
    counts = {"requests": requests, "tokens": tokens, "input-tokens": tokens, "output-tokens": output}
    headers = {"date": DATE}
    for kind, left in counts.items():
        headers[f"anthropic-ratelimit-{kind}-limit"] = "400000"
        headers[f"anthropic-ratelimit-{kind}-remaining"] = str(left)
        headers[f"anthropic-ratelimit-{kind}-reset"] = reset
    return httpx.Headers(headers)


def test_anthropic_headers_report_requests_and_tokens_left() -> None:
    assert remaining_room(anthropic(requests=49, tokens=399_000)) == (49, 399_000)
    hint = parse_rate_limits(anthropic(requests=49, tokens=399_000))
    assert hint is not None and hint.no_room_for == 0.0


@pytest.mark.parametrize(
    ("reset", "seconds"),
    [
        ("2026-12-06T03:44:58Z", 10.0),
        ("2026-12-06T03:44:58.5Z", 10.5),
        ("2026-12-06T04:44:58+01:00", 10.0),
        ("2026-12-06T03:44:40Z", 0.0),  # already past: room again now
        ("2026-12-07T03:44:48Z", MAX_RESET),
        ("tomorrow", 1.0),  # unreadable: the default wait
    ],
)
def test_anthropic_resets_are_rfc3339_times_read_against_the_answers_date(reset: str, seconds: float) -> None:
    hint = parse_rate_limits(anthropic(requests=0, tokens=399_000, reset=reset))
    assert hint is not None and hint.no_room_for == pytest.approx(seconds)


def test_anthropic_output_tokens_exhausted_leave_no_room() -> None:
    headers = anthropic(requests=49, tokens=399_000, output=0)
    assert room_left(headers) is False
    hint = parse_rate_limits(headers)
    assert hint is not None and hint.no_room_for == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("reset", "seconds"),
    [
        ("3", 3.0),  # Together: seconds
        (str(1_796_528_688 + 4), 4.0),  # a Unix time in seconds (the answer's Date is 1796528688)
        (str((1_796_528_688 + 4) * 1000), 4.0),  # OpenRouter: a Unix time in milliseconds
    ],
)
def test_the_unsuffixed_form_reports_requests_and_its_reset(reset: str, seconds: float) -> None:
    room = httpx.Headers(
        {"x-ratelimit-limit": "10", "x-ratelimit-remaining": "7", "x-ratelimit-remaining-tokens": "99"}
    )
    assert remaining_room(room) == (7, 99) and room_left(room) is True
    out = httpx.Headers({"date": DATE, "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset})
    assert remaining_room(out) == (0, None) and room_left(out) is False
    hint = parse_rate_limits(out)
    assert hint is not None and hint.no_room_for == pytest.approx(seconds)


def test_mistrals_per_minute_limits_feed_the_bucket_and_its_monthly_one_is_judged() -> None:
    """Mistral's headers (as its API sends them) were not read: a 429 with room left cooled the endpoint."""
    sent = {
        "x-ratelimit-limit-tokens-minute": "5000000",
        "x-ratelimit-remaining-tokens-minute": "4999911",
        "x-ratelimit-tokens-query-cost": "52",
        "x-ratelimit-limit-req-minute": "720",
        "x-ratelimit-remaining-req-minute": "717",
        "x-ratelimit-remaining-tokens-month": "90000",
    }
    assert remaining_room(httpx.Headers(sent)) == (717, 4999911) and room_left(httpx.Headers(sent)) is True
    month_out = httpx.Headers({**sent, "x-ratelimit-remaining-tokens-month": "0"})
    assert remaining_room(month_out) == (717, 4999911)  # a month's count is no minute bucket's
    assert room_left(month_out) is False
    hint = parse_rate_limits(month_out)
    assert hint is not None and hint.no_room_for == 1.0  # no reset sent: the default wait


def test_cerebras_windowed_resets_are_matched_to_their_own_limit() -> None:
    headers = httpx.Headers(
        {
            "x-ratelimit-remaining-requests-day": "14000",
            "x-ratelimit-reset-requests-day": "33011.382867",
            "x-ratelimit-remaining-tokens-minute": "0",
            "x-ratelimit-reset-tokens-minute": "11.382867",
        }
    )
    assert remaining_room(headers) == (None, 0) and room_left(headers) is False
    hint = parse_rate_limits(headers)
    assert hint is not None and hint.no_room_for == pytest.approx(11.382867)


@pytest.mark.parametrize(
    ("headers", "left", "no_room_for"),
    [
        ({"RateLimit": '"default";r=50;t=30'}, True, 0.0),
        ({"RateLimit": '"default";r=0;t=30'}, False, 30.0),
        ({"RateLimit": '"per-minute";r=5;t=20, "per-day";r=0;t=3000'}, False, 3000.0),
        ({"RateLimit": "day;r=0"}, False, 1.0),  # no reset: the default wait
        ({"RateLimit-Remaining": "0", "RateLimit-Reset": "7"}, False, 7.0),  # the draft's earlier form
        ({"RateLimit": "garbage"}, None, None),
        ({"RateLimit-Policy": '"default";q=100;w=60'}, None, None),  # a policy alone tells no room
    ],
)
def test_the_ietf_drafts_fields_are_judged(
    headers: dict[str, str], left: bool | None, no_room_for: float | None
) -> None:
    assert room_left(httpx.Headers(headers)) is left
    assert remaining_room(httpx.Headers(headers)) == (None, None)  # units it does not name: no bucket fed
    hint = parse_rate_limits(httpx.Headers(headers))
    assert (None if hint is None else hint.no_room_for) == no_room_for


def test_a_repeated_header_counts_its_least_remaining_and_its_latest_reset() -> None:
    repeated = httpx.Headers(
        [
            ("x-ratelimit-remaining-requests", "5"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-requests", "2s"),
            ("x-ratelimit-remaining-tokens", "900"),
            ("x-ratelimit-remaining-tokens", "900"),
        ]
    )
    assert repeated["x-ratelimit-remaining-requests"] == "5, 0"  # as httpx joins them
    assert remaining_room(repeated) == (0, 900)
    hint = parse_rate_limits(repeated)
    assert hint is not None and hint.no_room_for == 2.0
    twice = httpx.Headers([("x-ratelimit-remaining-requests", "5"), ("x-ratelimit-remaining-requests", "5")])
    assert remaining_room(twice) == (5, None) and room_left(twice) is True


def test_the_least_of_several_forms_reporting_one_limit_counts() -> None:
    both = httpx.Headers({"x-ratelimit-remaining-requests": "8", "x-ratelimit-remaining": "3"})
    assert remaining_room(both) == (3, None)


@pytest.mark.parametrize(
    ("headers", "left"),
    [
        ({"x-ratelimit-remaining-requests": "59", "x-ratelimit-remaining-tokens": "1200"}, True),
        ({"x-ratelimit-remaining-requests": "59", "x-ratelimit-remaining-tokens": "0"}, False),
        ({"x-ratelimit-remaining-requests": "0"}, False),
        ({"x-ratelimit-remaining-requests": "-1"}, False),
        ({"x-ratelimit-remaining-requests": "oops"}, None),
        ({"retry-after": "5"}, None),
        ({}, None),
    ],
)
def test_room_left_in_every_limit_reported(headers: dict[str, str], left: bool | None) -> None:
    assert room_left(httpx.Headers(headers)) is left


def test_headers_in_a_plain_mapping_are_read_whatever_their_case() -> None:
    assert remaining_room({"Anthropic-RateLimit-Requests-Remaining": "4"}) == (4, None)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("1.5", 1.5), ("0", 0.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "1x", "s", "-1", "1s2", "inf", "nan"])
def test_parse_duration_rejects_what_is_not_a_duration(text: str) -> None:
    assert parse_duration(text) is None


def test_parse_rate_limits() -> None:
    assert parse_rate_limits(httpx.Headers({})) is None
    assert parse_rate_limits(httpx.Headers({"x-ratelimit-remaining-requests": "oops"})) is None
    room = parse_rate_limits(httpx.Headers({"X-RateLimit-Remaining-Requests": "59"}))
    assert room is not None and room.no_room_for == 0
    both = httpx.Headers(
        {
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": "6m0s",
        }
    )
    hint = parse_rate_limits(both)
    assert hint is not None and hint.no_room_for == 360.0
    unreadable = parse_rate_limits(
        httpx.Headers({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "?"})
    )
    assert unreadable is not None and unreadable.no_room_for == 1.0
    huge = parse_rate_limits(httpx.Headers({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "99h"}))
    assert huge is not None and huge.no_room_for == MAX_RESET
