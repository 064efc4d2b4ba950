"""`sent_path` and `with_sent_path`: an URL's path read and written as sent, its percent-escapes kept; `path_under`:
compared however spelled."""

from __future__ import annotations

import httpx
import pytest

from llmguard_client._http.urlpath import names_endpoint, normal_segment, path_under, sent_path, with_sent_path


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://h/gw%2Fx/v1?api-version=1", "/gw%2Fx/v1"),
        ("http://h/a%2541/v1", "/a%2541/v1"),
        ("http://h/dep%3Fx/v1?", "/dep%3Fx/v1"),
        ("http://h/openai/deployments/modèle", "/openai/deployments/mod%C3%A8le"),
        ("http://h", "/"),
    ],
)
def test_sent_path_is_the_path_as_sent_without_its_query(url: str, expected: str) -> None:
    assert sent_path(httpx.URL(url)) == expected


def test_with_sent_path_writes_the_escapes_as_they_are() -> None:
    base = httpx.URL("https://user:pw@gw.example:8443/old?drop=1")
    moved = with_sent_path(base, "/dep%3Fx/a%2541/v1", b"api-version=1&q=a%26b")
    assert str(moved) == "https://user:pw@gw.example:8443/dep%3Fx/a%2541/v1?api-version=1&q=a%26b"
    assert sent_path(moved) == "/dep%3Fx/a%2541/v1"
    assert with_sent_path(base, "/gw%2Fx").raw_path == b"/gw%2Fx"


@pytest.mark.parametrize(
    ("path", "prefix", "expected"),
    [
        ("/tenants/team@corp/v1/chat/completions", "/tenants/team%40corp/v1", "/chat/completions"),
        ("/tenants/team%40corp/v1/chat/completions", "/tenants/team@corp/v1", "/chat/completions"),
        ("/%7Eme/v1", "/~me/v1", ""),
        ("/~me/v1/", "/%7eme/v1", "/"),
        ("/aAb/v1/x%2fy", "/a%41b/v1", "/x%2fy"),  # the rest as the path spells it
        ("/a+b/v1/x", "/a%2Bb/v1", "/x"),
        ("/model/claude-v1%3A0/invoke", "/model/claude-v1:0", "/invoke"),
        ("/mod%c3%a8le/v1/x", "/mod%C3%A8le/v1", "/x"),
        ("/gw%2fx/v1/x", "/gw%2Fx/v1", "/x"),
        ("/a|b/v1/x", "/a%7Cb/v1", "/x"),
        ("/v1/x", "", "/v1/x"),
        # escapes of what a segment cannot hold literally are not the character
        ("/gw/x/v1/x", "/gw%2Fx/v1", None),
        ("/gw%2Fx/v1/x", "/gw/x/v1", None),
        ("/a%41/v1/x", "/a%2541/v1", None),
        ("/aA/v1/x", "/a%2541/v1", None),
        ("/a%2541/v1/x", "/aA/v1", None),
        ("/mod%C3%A8le/v1", "/mod%C3%A9le/v1", None),
        # whole segments only
        ("/v1beta/x", "/v1", None),
        ("/v", "/v1", None),
    ],
)
def test_path_under_compares_segments_however_spelled(path: str, prefix: str, expected: str | None) -> None:
    assert path_under(path, prefix) == expected


def test_normal_segment_decodes_only_what_a_segment_may_hold_literally() -> None:
    literal = "AZaz09-._~!$&'()*+,;=:@"
    assert normal_segment("".join(f"%{ord(c):02x}" for c in literal)) == literal
    assert normal_segment("%2f%3f%23%25%c3%a8%20%7c") == "%2F%3F%23%25%C3%A8%20%7C"
    assert normal_segment("a|b^%zz%2") == "a%7Cb%5E%25zz%252"


ENDPOINTS = ("/chat/completions", "/completions", "/responses", "/messages")


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("/v1/messages", True),
        ("/v1/chat/completions/", True),
        ("/openai/deployments/gpt/chat/completions", True),
        ("/gw/threads-api/v1/messages", True),
        ("/v1/threads/thread_abc/messages", False),  # a message stored in an Assistants thread
        ("/v1/threads/thread_abc/messages/", False),
        ("/v1/threads/thread_abc/runs", False),
        ("/openai/deployments/threads/chat/completions", True),  # a deployment named "threads"
        ("/v1/threads/chat/completions", True),
        ("/threads/v1/messages", True),  # Anthropic behind a base path ending /threads
        ("/tenant/threads/v1beta/messages", True),
        ("/v1/models", False),
    ],
)
def test_names_endpoint_tells_a_generation_call_from_a_threads_resource(path: str, named: bool) -> None:
    assert names_endpoint(path, ENDPOINTS) is named
