"""`sent_path` and `with_sent_path`: an URL's path read and written as sent, its percent-escapes kept."""

from __future__ import annotations

import httpx
import pytest

from llmguard_client._http.urlpath import sent_path, with_sent_path


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
