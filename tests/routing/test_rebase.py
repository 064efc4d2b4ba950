"""`rebase`: a request URL re-aimed at one replica (its origin and path prefix), nothing of the original origin kept."""

from __future__ import annotations

import httpx
import pytest

from llmguard_client._routing.replicas import rebase

R1 = httpx.URL("http://10.0.0.1:8000")
R2 = httpx.URL("http://10.0.0.2:9000")
R1_V1 = httpx.URL("http://10.0.0.1:8000/v1")
R2_API = httpx.URL("https://gw.example.com/tenant/api/v1")
AZ_A = httpx.URL("https://a.openai.azure.com/openai/deployments/depA")
AZ_B = httpx.URL("https://b.openai.azure.com/openai/deployments/depB")


@pytest.mark.parametrize(
    ("url", "base", "known", "expected"),
    [
        # known replica without a path prefix: the whole path moves over
        ("http://10.0.0.1:8000/v1/chat/completions", R2, (R1, R2), "http://10.0.0.2:9000/v1/chat/completions"),
        ("http://10.0.0.1:8000/v1/chat/completions", R1, (R1, R2), "http://10.0.0.1:8000/v1/chat/completions"),
        # known replica with a path prefix: the prefix is swapped for the target's
        (
            "http://10.0.0.1:8000/v1/chat/completions",
            R2_API,
            (R1_V1, R2_API),
            "https://gw.example.com/tenant/api/v1/chat/completions",
        ),
        (
            "https://gw.example.com/tenant/api/v1/completions",
            R1_V1,
            (R1_V1, R2_API),
            "http://10.0.0.1:8000/v1/completions",
        ),
        ("http://10.0.0.1:8000/v1", R2_API, (R1_V1, R2_API), "https://gw.example.com/tenant/api/v1"),
        # same host, path not under the known prefix: appended to the target's base
        ("http://10.0.0.1:8000/v1beta/models", R2, (R1_V1, R2), "http://10.0.0.2:9000/v1beta/models"),
        # on a known origin under no base (an Azure client's resource path, another deployment): kept as built
        ("https://a.openai.azure.com/openai/models", AZ_A, (AZ_A, AZ_B), "https://a.openai.azure.com/openai/models"),
        (
            "https://a.openai.azure.com/openai/deployments/emb/embeddings",
            AZ_A,
            (AZ_A, AZ_B),
            "https://a.openai.azure.com/openai/deployments/emb/embeddings",
        ),
        ("http://10.0.0.1:8000/health", R1_V1, (R1_V1,), "http://10.0.0.1:8000/health"),
        # a deployment's path moves to the other deployment
        (
            "https://a.openai.azure.com/openai/deployments/depA/chat/completions",
            AZ_B,
            (AZ_A, AZ_B),
            "https://b.openai.azure.com/openai/deployments/depB/chat/completions",
        ),
        # unknown host: the path goes under the base, the segments they share (an OpenAI-style /v1) once
        ("http://api.example.com/v1/chat/completions", R1, (R1, R2), "http://10.0.0.1:8000/v1/chat/completions"),
        ("http://api.example.com/chat/completions", R1_V1, (R1_V1,), "http://10.0.0.1:8000/v1/chat/completions"),
        ("http://llm.internal/v1/chat/completions", R1_V1, (R1_V1,), "http://10.0.0.1:8000/v1/chat/completions"),
        ("http://llm.internal/v1", R1_V1, (R1_V1,), "http://10.0.0.1:8000/v1"),
        (
            "http://llm.internal/v1/chat/completions",
            R2_API,
            (R2_API,),
            "https://gw.example.com/tenant/api/v1/chat/completions",
        ),
        (
            "http://llm.internal/api/v1/models",
            R2_API,
            (R2_API,),
            "https://gw.example.com/tenant/api/v1/models",
        ),
        # shared only when whole segments match: /v1beta is not /v1
        ("http://llm.internal/v1beta/models", R1_V1, (R1_V1,), "http://10.0.0.1:8000/v1/v1beta/models"),
        ("http://llm.internal/other/v1/models", R1_V1, (R1_V1,), "http://10.0.0.1:8000/v1/other/v1/models"),
        # same host, another port or scheme: not that replica (its path goes under the base, as any unknown one)
        ("http://10.0.0.1:8001/v1/models", R1_V1, (R1_V1,), "http://10.0.0.1:8000/v1/models"),
        ("https://10.0.0.1:8000/v2/models", R1_V1, (R1_V1,), "http://10.0.0.1:8000/v1/v2/models"),
    ],
    ids=[
        "no_prefix_to_other",
        "no_prefix_to_self",
        "prefix_swapped",
        "prefix_swapped_back",
        "prefix_exact",
        "prefix_lookalike",
        "azure_resource_path",
        "azure_other_deployment",
        "outside_the_base",
        "azure_deployment_swapped",
        "unknown_host",
        "unknown_host_prefix_base",
        "virtual_v1_on_v1",
        "virtual_v1_exact",
        "virtual_v1_on_deep_base",
        "virtual_api_v1_on_deep_base",
        "virtual_lookalike_segment",
        "virtual_not_at_the_start",
        "other_port",
        "other_scheme",
    ],
)
def test_rebase(url: str, base: httpx.URL, known: tuple[httpx.URL, ...], expected: str) -> None:
    assert str(rebase(httpx.URL(url), base, known)) == expected


@pytest.mark.parametrize(
    "query",
    ["api-version=2024-06-01", "a=1&b=2&a=3", "q=a%26b&r=%20x", "flag"],
    ids=["simple", "repeated", "encoded", "bare"],
)
def test_rebase_keeps_the_query(query: str) -> None:
    for known in ((R1_V1, R2_API), ()):
        moved = rebase(httpx.URL(f"http://10.0.0.1:8000/v1/chat/completions?{query}"), R2_API, known)
        assert moved.query == query.encode()
        assert moved.host == "gw.example.com" and moved.scheme == "https"


def test_rebase_without_query_has_none() -> None:
    moved = rebase(httpx.URL("http://10.0.0.1:8000/v1/models"), R2, (R1,))
    assert moved.query == b"" and "?" not in str(moved)


def test_rebase_keeps_percent_encoded_paths() -> None:
    moved = rebase(httpx.URL("http://10.0.0.1:8000/v1/files/a%20b%2Fc"), R2, (R1,))
    assert moved.raw_path == b"/v1/files/a%20b%2Fc"


@pytest.mark.parametrize(
    ("escaped", "spelled"),
    [
        *((escaped, escaped) for escaped in ("gw%2Fx", "a%2541", "dep%3Fx", "mod%C3%A8le", "my%20dep")),
        ("team%40corp", "team@corp"),
        ("team@corp", "team%40corp"),
        ("%7eteam", "~team"),
        ("a%2Bb", "a+b"),
        ("claude-v1:0", "claude-v1%3A0"),
        ("mod%c3%a8le", "mod%C3%A8le"),
    ],
)
def test_rebase_keeps_the_percent_escapes_of_a_base_path(escaped: str, spelled: str) -> None:
    """A base path as its URL spells it (``%2F`` is no slash, ``%3F`` no query, ``%25`` no second escape),
    matched however a request spells it (``team@corp`` for ``team%40corp``): a request moves onto it, off it and
    from a virtual base URL onto it with the base's escapes as they are, and stays on it exactly as it is."""
    plain, odd = httpx.URL("http://10.0.0.1:8000/v1"), httpx.URL(f"http://10.0.0.2:9000/{escaped}/v1")
    tail = "/chat/completions?api-version=2024-10-21"
    onto = rebase(httpx.URL(f"{plain}{tail}"), odd, (plain, odd))
    assert (onto.host, onto.raw_path) == ("10.0.0.2", f"/{escaped}/v1{tail}".encode())
    request = httpx.URL(f"http://10.0.0.2:9000/{spelled}/v1{tail}")
    off = rebase(request, plain, (plain, odd))
    assert (off.host, off.raw_path) == ("10.0.0.1", f"/v1{tail}".encode())
    assert rebase(request, odd, (plain, odd)) == request
    for virtual in (f"http://llm.internal/v1{tail}", f"http://llm.internal/{spelled}/v1{tail}"):
        assert rebase(httpx.URL(virtual), odd, (plain, odd)).raw_path == f"/{escaped}/v1{tail}".encode()


@pytest.mark.parametrize("listed", [("v1", "v1/x"), ("v1/x", "v1")], ids=["shallow_first", "deep_first"])
def test_rebase_swaps_the_deepest_base_a_request_is_under(listed: tuple[str, str]) -> None:
    """Two bases on one origin, one inside the other: a request under ``/v1/x`` is ``/v1/x``'s, whichever is listed
    first. Taken for ``/v1``'s (the first listed), it went to ``/v1/x`` as ``/v1/x/x/...``: 404s the plain SDK never
    met, and that replica drained as rejecting."""
    known = tuple(httpx.URL(f"http://10.0.0.1:8000/{path}") for path in listed)
    deep, shallow = httpx.URL("http://10.0.0.1:8000/v1/x"), httpx.URL("http://10.0.0.1:8000/v1")
    url = httpx.URL("http://10.0.0.1:8000/v1/x/chat/completions")
    assert str(rebase(url, deep, known)) == "http://10.0.0.1:8000/v1/x/chat/completions"
    assert str(rebase(url, shallow, known)) == "http://10.0.0.1:8000/v1/chat/completions"
    url = httpx.URL("http://10.0.0.1:8000/v1/chat/completions")
    assert str(rebase(url, deep, known)) == "http://10.0.0.1:8000/v1/x/chat/completions"


def test_rebase_never_keeps_the_original_origin() -> None:
    moved = rebase(httpx.URL("http://user:pw@evil.example:1/v1/x"), R1, (R1, R2))
    assert (moved.scheme, moved.host, moved.port) == ("http", "10.0.0.1", 8000)
    assert moved.userinfo == b""
