"""RedirectTargets: which redirects it remembers, for whom, for how long, and how many."""

from __future__ import annotations

import logging

import httpx
import pytest

from llmguard_client._http.redirects import RedirectTargets

REPLICA = httpx.URL("http://replica:8000/v1")
OWN = "http://llm.internal/v1/chat/completions"


def redirect(location: str, status: int = 307) -> httpx.Response:
    return httpx.Response(status, headers={"location": location})


def noted(location: str, *, status: int = 307, own: bool = True, url: str = OWN) -> RedirectTargets[str]:
    targets = RedirectTargets[str]([REPLICA])
    targets.note(httpx.Request("POST", url), redirect(location, status), "call", 0.0, own=own)
    return targets


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_origin_is_taken_once_by_the_request_that_follows_it(status: int) -> None:
    targets = noted("https://elsewhere/v1/chat/completions?x=1", status=status)
    assert targets.take(httpx.URL("https://elsewhere/v1/chat/completions?x=1"), 1.0) == "call"
    assert targets.take(httpx.URL("https://elsewhere/v1/chat/completions?x=1"), 1.0) is None


@pytest.mark.parametrize(
    "location",
    [
        "http://replica:8000/v1/other",  # a replica's origin: rebased onto the replicas as any request
        "http://REPLICA:8000/v1/other",
        "/v1/other",  # relative: the guard's own origin
        "http://llm.internal/v2/chat",  # the client's base URL's origin, which the guard rebases
        "http://llm.internal:80/v2/chat",
        "ftp://elsewhere/file",
        "http://[::1",  # not a URL
    ],
)
def test_a_redirect_on_the_guards_own_or_a_replicas_origin_is_not_remembered(location: str) -> None:
    assert len(noted(location)) == 0


def test_an_answer_that_is_not_a_redirect_is_not_remembered() -> None:
    assert len(noted("https://elsewhere/v1/chat", status=200)) == 0
    assert len(noted("https://elsewhere/v1/chat", status=304)) == 0


def test_from_another_origin_a_relative_redirect_stays_there() -> None:
    targets = noted("/v1/chat/completions", own=False, url="https://elsewhere/old")
    assert targets.take(httpx.URL("https://elsewhere/v1/chat/completions"), 0.0) == "call"


def test_http_to_https_on_a_replicas_host_is_another_origin() -> None:
    targets = noted("https://replica/v1/chat/completions")
    assert targets.take(httpx.URL("https://replica:443/v1/chat/completions"), 0.0) == "call"


def test_each_answer_is_taken_by_one_request_in_the_order_noted() -> None:
    targets = RedirectTargets[str]([REPLICA])
    for tag in ("first", "second"):
        targets.note(httpx.Request("POST", OWN), redirect("https://elsewhere/v1/x"), tag, 0.0, own=True)
    url = httpx.URL("https://elsewhere/v1/x")
    assert [targets.take(url, 0.0), targets.take(url, 0.0), targets.take(url, 0.0)] == ["first", "second", None]


def test_a_target_is_forgotten_after_keep_for_seconds() -> None:
    targets = RedirectTargets[str]([REPLICA], keep_for=60.0)
    targets.note(httpx.Request("POST", OWN), redirect("https://elsewhere/a"), "early", 0.0, own=True)
    targets.note(httpx.Request("POST", OWN), redirect("https://elsewhere/b"), "late", 30.0, own=True)
    assert targets.take(httpx.URL("https://elsewhere/a"), 60.0) is None
    assert len(targets) == 1
    assert targets.take(httpx.URL("https://elsewhere/b"), 89.9) == "late"
    targets.note(httpx.Request("POST", OWN), redirect("https://elsewhere/c"), "later", 80.0, own=True)
    assert len(targets) == 1
    assert targets.take(httpx.URL("https://elsewhere/c"), 140.0) is None
    assert len(targets) == 0


def test_at_most_most_targets_are_remembered_the_oldest_forgotten_first() -> None:
    targets = RedirectTargets[int]([REPLICA], most=3)
    for i in range(5):
        targets.note(httpx.Request("POST", OWN), redirect(f"https://elsewhere/{i}"), i, float(i), own=True)
    assert len(targets) == 3
    taken = [targets.take(httpx.URL(f"https://elsewhere/{i}"), 5.0) for i in range(5)]
    assert taken == [None, None, 2, 3, 4]


def test_the_first_redirect_to_each_origin_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    targets = RedirectTargets[str]([REPLICA])
    with caplog.at_level(logging.WARNING, logger="llmguard_client"):
        for location in ("https://a/1", "https://a/2", "https://b/1"):
            targets.note(httpx.Request("POST", OWN), redirect(location), "call", 0.0, own=True)
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2
    assert "https://a " not in logged[0] and "https://a," in logged[0] and "https://b," in logged[1]
