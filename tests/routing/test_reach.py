"""`reach`: which replicas a request's URL can go to; the openai SDK's Azure client through a Guard whose replicas are
Azure deployments or resources, against loopback resources that check every path."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import httpx
import openai
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmguard_client import Guard, Replica
from llmguard_client._routing.reach import Reach, beside, outside, own, stored
from llmguard_client._routing.replicas import rebase
from tests.loopback import LoopbackServer, running

A = httpx.URL("https://a.openai.azure.com/openai/deployments/depA")
A2 = httpx.URL("https://a.openai.azure.com/openai/deployments/depA2")
B = httpx.URL("https://b.openai.azure.com/openai/deployments/depB")
RA = httpx.URL("https://a.openai.azure.com")
RB = httpx.URL("https://b.openai.azure.com")
V1 = httpx.URL("http://10.0.0.1:8000/v1")
V2 = httpx.URL("http://10.0.0.2:8000/v1")


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/openai/deployments/dep1/chat/completions", False),
        ("POST", "/v1/responses", False),
        ("POST", "/v1/embeddings", False),
        ("POST", "/v1/messages/count_tokens", False),
        ("POST", "/v1beta/models/gemini:generateContent", False),
        ("POST", "/openai/deployments/files/chat/completions", False),  # a deployment named "files"
        ("POST", "/openai/files", True),
        ("GET", "/openai/files/file-1", True),
        ("GET", "/v1/files/file-1/content", True),
        ("POST", "/v1/batches", True),
        ("POST", "/v1/messages/batches", True),
        ("GET", "/v1/vector_stores/vs_1/files", True),
        ("GET", "/openai/models", True),
        ("GET", "/v1/responses/resp_1", True),
        ("POST", "/v1/responses/resp_1/cancel", True),
        ("GET", "/v1/chat/completions", True),  # the stored chat completions
        ("DELETE", "/v1/chat/completions/chatcmpl-1", True),
    ],
)
def test_stored(method: str, path: str, expected: bool) -> None:
    assert stored(method, path) is expected


@pytest.mark.parametrize(
    ("method", "url", "bases", "expected"),
    [
        # under a base: any replica (the prefix is swapped), a stored object only the base's
        ("POST", A.join("depA/chat/completions"), (A, B), ()),
        ("POST", B.join("depB/chat/completions"), (A, B), ()),
        ("POST", "https://b.openai.azure.com/openai/files", (RA, RB), (0,)),
        ("GET", "http://10.0.0.2:8000/v1/files/f1", (V1, V2), (0,)),
        ("GET", "http://10.0.0.2:8000/v1/responses/resp_1", (V1, V2), (0,)),
        # on a replica's origin outside every base: that origin's replicas only, a stored object the first's
        ("GET", "https://a.openai.azure.com/openai/models", (A, B), (1,)),
        ("POST", "https://a.openai.azure.com/openai/deployments/emb/embeddings", (A, B), (1,)),
        ("POST", "https://b.openai.azure.com/openai/deployments/emb/embeddings", (A, A2, B), (0, 1)),
        ("POST", "https://a.openai.azure.com/openai/deployments/emb/embeddings", (A, A2, B), (2,)),
        ("POST", "https://a.openai.azure.com/openai/files", (A, A2, B), (1, 2)),
        ("GET", "https://a.openai.azure.com/openai/models", (A, A2, B), (1, 2)),
        ("POST", "https://a.openai.azure.com/openai/responses", (A, A2, B), (2,)),
        # an origin no replica has (a virtual base URL): any replica, a stored object the first
        ("POST", "http://llm.internal/v1/chat/completions", (V1, V2), ()),
        ("POST", "http://llm.internal/v1/files", (V1, V2), (1,)),
        # one replica: nothing to choose
        ("POST", "https://b.openai.azure.com/openai/files", (A,), ()),
        # two bases on one origin, one inside the other: a stored object under the deeper one is its
        ("GET", "http://10.0.0.1:8000/v1/x/files/f1", (V1, V1.join("v1/x")), (0,)),
    ],
    ids=[
        "under_base",
        "under_other_base",
        "stored_under_second_base",
        "stored_under_second_v1",
        "stored_response_under_second_v1",
        "resource_path",
        "other_deployment",
        "other_deployment_two_on_origin",
        "other_deployment_one_on_origin",
        "stored_on_shared_origin",
        "models_on_shared_origin",
        "azure_responses_outside",
        "virtual",
        "virtual_stored",
        "one_replica",
        "stored_under_the_deeper_base",
    ],
)
def test_outside(method: str, url: httpx.URL | str, bases: tuple[httpx.URL, ...], expected: tuple[int, ...]) -> None:
    assert Reach(bases).where(method, httpx.URL(url))[0] == expected
    if len(bases) > 1:
        assert outside(method, httpx.URL(url), bases) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://east.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=1", False),
        ("https://east.openai.azure.com/openai/deployments/gpt4o", False),
        ("https://east.openai.azure.com/openai/deployments/gpt35/chat/completions?api-version=1", True),
        ("https://east.openai.azure.com/openai/deployments/gpt4o-mini/chat/completions", True),  # not a prefix
        ("https://east.openai.azure.com/openai/files", True),
        ("https://west.openai.azure.com/openai/deployments/gpt4o-west/embeddings", False),
        ("http://llm.internal/v1/chat/completions", False),  # no replica's origin: rebased onto one
    ],
)
def test_beside(url: str, expected: bool) -> None:
    """A request on a replica's origin under none of the bases: another deployment's, or the resource's own."""
    bases = (
        httpx.URL("https://east.openai.azure.com/openai/deployments/gpt4o"),
        httpx.URL("https://west.openai.azure.com/openai/deployments/gpt4o-west"),
    )
    assert beside(httpx.URL(url), bases) is expected
    assert Reach(bases).where("POST", httpx.URL(url))[1] is expected
    assert Reach(bases[:1]).where("POST", httpx.URL(url))[1] is (expected and "west" not in url)


SPELLED_ALIKE = [
    *((escaped, escaped) for escaped in ("gw%2Fx", "a%2541", "dep%3Fx", "mod%C3%A8le", "my%20dep")),
    ("team%40corp", "team@corp"),
    ("team@corp", "team%40corp"),
    ("%7Eteam", "~team"),
    ("a%41b", "aAb"),
    ("a+b", "a%2Bb"),
    ("claude-v1%3A0", "claude-v1:0"),
    ("mod%c3%a8le", "mod%C3%A8le"),
    ("gw%2fx", "gw%2Fx"),
]
"""(a deployment's name in its replica's URL, the same name as a client may spell it): escapes of what a path
segment holds literally read as the character (``%40`` is ``@``), hex digits in either case."""
SPELLED_APART = [("gw%2Fx", "gw/x"), ("a%2541", "a%41"), ("a%2541", "aA"), ("mod%C3%A8le", "mod%C3%A9le")]
"""Names that are not the same: ``%2F`` is no ``/``, ``%25`` no second escape."""


@pytest.mark.parametrize(
    ("deployment", "spelled", "alike"),
    [(*pair, True) for pair in SPELLED_ALIKE] + [(*pair, False) for pair in SPELLED_APART],
)
def test_a_base_path_is_matched_however_spelled(deployment: str, spelled: str, alike: bool) -> None:
    """Two deployments whose name holds a percent-escape: a request under one (its path as the SDK sends it, the
    name spelled as the client spells it) is under that base, so any replica may take it and a cool-down or
    circuit of theirs learns from it; a name meaning another path is another deployment's."""
    bases = tuple(httpx.URL(f"https://{r}.openai.azure.com/openai/deployments/{deployment}") for r in "ab")
    url = httpx.URL(f"{RB}/openai/deployments/{spelled}/chat/completions?api-version=2024-10-21")
    assert Reach(bases).where("POST", url) == (((), False) if alike else ((0,), True))
    assert own(url, bases) == (1,)
    assert beside(httpx.URL(f"{RA}/openai/deployments/{spelled}x/chat/completions"), bases)


# --- the openai SDK's AzureOpenAI through a Guard -------------------------------------------------------------


class AzureResource:
    """A loopback Azure OpenAI resource: its deployments' chat and embeddings, ``/openai/models`` and
    ``/openai/files`` (kept here); any other path is a 404, as Azure's. Records every request's method and path,
    the path as sent (a deployment's name with its percent-escapes, as ``deployments`` spells it)."""

    def __init__(self, name: str, deployments: tuple[str, ...]) -> None:
        self.name = name
        self.deployments = deployments
        self.seen: list[tuple[str, str, str]] = []
        """(method, path, api-key) of each request."""
        self.files: dict[str, dict[str, object]] = {}
        self.server = LoopbackServer(name, routes=[Route("/openai/{rest:path}", self._handle, methods=["GET", "POST"])])

    @property
    def url(self) -> str:
        return self.server.url

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.seen]

    async def _handle(self, request: Request) -> Response:
        method, path = request.method, request.scope["raw_path"].decode("ascii")
        await request.body()
        self.seen.append((method, path, request.headers.get("api-key", "")))
        if request.query_params.get("api-version") != "2024-10-21":
            return JSONResponse({"error": {"code": "400", "message": "api-version"}}, status_code=400)
        parts = path.split("/")[2:]  # "/openai/deployments/d/x" -> ["deployments", "d", "x"]
        if parts[:1] == ["deployments"] and len(parts) >= 3 and parts[1] in self.deployments:
            if parts[2:] == ["chat", "completions"]:
                return JSONResponse(_chat(parts[1]))
            if parts[2:] == ["embeddings"]:
                embedding = {"object": "embedding", "index": 0, "embedding": [0.5]}
                usage = {"prompt_tokens": 1, "total_tokens": 1}
                return JSONResponse({"object": "list", "data": [embedding], "model": parts[1], "usage": usage})
        if parts == ["models"] and method == "GET":
            return JSONResponse({"object": "list", "data": [{"id": d, "object": "model"} for d in self.deployments]})
        if parts == ["files"] and method == "POST":
            file_id = f"file-{self.name}-{len(self.files)}"
            self.files[file_id] = {"id": file_id, "object": "file", "bytes": 1, "created_at": 1, "filename": "a"}
            self.files[file_id]["purpose"] = "batch"
            return JSONResponse(self.files[file_id])
        if parts[:1] == ["files"] and len(parts) == 2 and method == "GET" and parts[1] in self.files:
            return JSONResponse(self.files[parts[1]])
        return JSONResponse({"error": {"code": "404", "message": f"Resource not found: {path}"}}, status_code=404)


def _chat(model: str) -> dict[str, object]:
    message = {"role": "assistant", "content": "hello"}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@pytest.fixture
def resources() -> Iterator[tuple[AzureResource, AzureResource]]:
    a = AzureResource("a", ("depA", "emb", "dep1"))
    b = AzureResource("b", ("depB", "dep1"))
    with running([a.server, b.server]):
        yield a, b


def _azure(guard: Guard, endpoint: str, deployment: str | None = None) -> openai.AzureOpenAI:
    return openai.AzureOpenAI(
        azure_endpoint=endpoint,
        azure_deployment=deployment,
        api_version="2024-10-21",
        api_key="SDK-KEY",
        max_retries=0,
        http_client=guard.http_client_for(openai.AzureOpenAI),
    )


def _chat_until_both(client: openai.AzureOpenAI, model: str, b: AzureResource) -> None:
    """Chat calls until resource ``b`` took one (the router spreads them; 20 at most)."""
    for _ in itertools.repeat(None, 20):
        reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "hello"
        if any(path.endswith("/chat/completions") for path in b.paths()):
            return
    raise AssertionError(f"no chat call reached {b.url}: {b.seen}")


def test_azure_deployments_as_replicas_serve_every_path_the_sdk_builds(
    resources: tuple[AzureResource, AzureResource],
) -> None:
    """Two deployments on two resources as replicas, the base URL the SDK uses: chat calls go to either
    deployment; the resource's own paths and another deployment's go where the SDK aimed them."""
    a, b = resources
    replicas = [
        Replica(f"{a.url}/openai/deployments/depA", headers={"api-key": "KEY-A"}),
        Replica(f"{b.url}/openai/deployments/depB", headers={"api-key": "KEY-B"}),
    ]
    with Guard(replicas=replicas) as guard:
        client = _azure(guard, a.url, "depA")
        _chat_until_both(client, "gpt-4o", b)
        assert [m.id for m in client.models.list()] == ["depA", "emb", "dep1"]
        file_id = client.files.create(file=("a.jsonl", b'{"a":1}\n'), purpose="batch").id
        assert [client.files.retrieve(file_id).id for _ in range(4)] == [file_id] * 4
        # no azure_deployment: the SDK puts each call's model in the path
        plain = _azure(guard, a.url)
        assert len(plain.embeddings.create(model="emb", input="x").data) == 1
        plain.chat.completions.create(model="depA", messages=[{"role": "user", "content": "hi"}])
    assert {(m, p) for m, p, _ in b.seen} == {("POST", "/openai/deployments/depB/chat/completions")}
    assert {key for _, _, key in b.seen} == {"KEY-B"}
    assert {p for p in a.paths() if not p.endswith("/chat/completions")} == {
        "/openai/models",
        "/openai/files",
        f"/openai/files/{file_id}",
        "/openai/deployments/emb/embeddings",
    }
    assert {p for p in a.paths() if p.endswith("/chat/completions")} == {"/openai/deployments/depA/chat/completions"}
    assert {key for _, _, key in a.seen} == {"KEY-A"}


def test_a_resource_path_reaches_its_resource_while_its_circuit_is_open(
    resources: tuple[AzureResource, AzureResource],
) -> None:
    """The resource the client names has its circuit open (its chat calls kept failing; the chats go to the
    other): a call of its own still goes to it, as it would with that resource alone, and is served."""
    a, b = resources
    replicas = [
        Replica(f"{a.url}/openai/deployments/depA", headers={"api-key": "KEY-A"}),
        Replica(f"{b.url}/openai/deployments/depB", headers={"api-key": "KEY-B"}),
    ]
    with Guard(replicas=replicas) as guard:
        guard._replica_set.states[0].open_until = math.inf  # open until the test ends, whatever the clock
        snapshot = guard.snapshot()
        assert snapshot.replicas[0].circuit_open_for > 0 and not snapshot.panic
        client = _azure(guard, a.url, "depA")
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        file_id = client.files.create(file=("a.jsonl", b'{"a":1}\n'), purpose="batch").id
        assert client.files.retrieve(file_id).id == file_id
    assert file_id.startswith("file-a-")
    assert b.paths() == ["/openai/deployments/depB/chat/completions"]
    assert a.paths() == ["/openai/files", f"/openai/files/{file_id}"]


@pytest.mark.parametrize("home", [0, 1], ids=["first", "second"])
def test_stored_objects_stay_on_the_resource_the_client_names(
    resources: tuple[AzureResource, AzureResource], home: int
) -> None:
    """Two resources as replicas: chat calls go to both; a file is created, read and listed on the resource the
    client's endpoint names, never on the other (where it does not exist)."""
    a, b = resources
    replicas = [Replica(a.url, headers={"api-key": "KEY-A"}), Replica(b.url, headers={"api-key": "KEY-B"})]
    named, other = (a, b) if home == 0 else (b, a)
    with Guard(replicas=replicas) as guard:
        client = _azure(guard, named.url, "dep1")
        _chat_until_both(client, "gpt-4o", other)
        file_id = client.files.create(file=("a.jsonl", b'{"a":1}\n'), purpose="batch").id
        assert [client.files.retrieve(file_id).id for _ in range(6)] == [file_id] * 6
        assert [m.id for m in client.models.list()] == list(named.deployments)
    assert file_id.startswith(f"file-{named.name}-")
    assert [p for p in other.paths() if "/files" in p or "/models" in p] == []
    assert named.paths().count(f"/openai/files/{file_id}") == 6


@pytest.mark.parametrize(("deployment", "spelled"), SPELLED_ALIKE)
@pytest.mark.parametrize("home", [0, 1], ids=["client_on_plain", "client_on_escaped"])
def test_a_deployment_named_with_a_percent_escape_serves_its_share_of_the_calls(
    deployment: str, spelled: str, home: int
) -> None:
    """Beside a deployment with a plain name, one whose name holds a percent-escape (``%2F`` is no slash, ``%3F``
    no query, ``%25`` no second escape), which a client may spell otherwise (``team@corp`` for ``team%40corp``):
    whichever of the two the client names, its chat calls go to both, each with the path its deployment's URL
    spells (but the client's own, sent as it built it), and every one is served."""
    a, b = AzureResource("a", ("depA",)), AzureResource("b", (deployment, spelled))
    replicas = [
        Replica(f"{a.url}/openai/deployments/depA", headers={"api-key": "KEY-A"}),
        Replica(f"{b.url}/openai/deployments/{deployment}", headers={"api-key": "KEY-B"}),
    ]
    named, name, other = (a, "depA", b) if home == 0 else (b, spelled, a)
    with running([a.server, b.server]), Guard(replicas=replicas) as guard:
        _chat_until_both(_azure(guard, named.url, name), "gpt-4o", other)
    assert set(a.paths()) <= {"/openai/deployments/depA/chat/completions"}
    assert set(b.paths()) <= {f"/openai/deployments/{n}/chat/completions" for n in (deployment, name)}


async def test_a_second_host_that_is_no_replica_is_warned_of_once(
    servers: list[LoopbackServer], caplog: pytest.LogCaptureFixture
) -> None:
    """A client copied with another service's base URL sends its requests, and its key, to the replicas: the
    first origin no replica has is the client's virtual base URL, a second one is logged, once."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    async with Guard([servers[0].url], instrumentation=None) as guard, guard.http_client() as client:
        for url in ("http://llm.internal/v1", servers[0].url + "/v1", "http://llm.internal/v1"):
            assert (await client.post(url + "/chat/completions", json=body)).status_code == 200
        assert not [r for r in caplog.records if "neither host is a replica" in r.getMessage()]
        for _ in range(2):
            assert (await client.post("http://other.example/v1/chat/completions", json=body)).status_code == 200
    [warning] = [r for r in caplog.records if "neither host is a replica" in r.getMessage()]
    assert "http://other.example" in warning.getMessage() and "http://llm.internal" in warning.getMessage()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://east.example/v1/model/m/invoke", (0, 2)),  # under the first base: the bases with its path
        ("https://east.example/other/path", (0, 1, 2)),  # under no base: every replica there keeps its path
        ("https://west.example/v1/model/m/invoke", (3,)),
        ("https://north.example/v1/model/m/invoke", ()),  # no replica's origin
        ("https://south.example/model/claude-v1%3A0/invoke", (4, 5)),  # under a base however spelled
        ("https://south.example/model/claude-v1:0/invoke", (4, 5)),
    ],
)
def test_a_signed_url_reaches_only_the_replicas_that_send_it_as_it_is(url: str, expected: tuple[int, ...]) -> None:
    bases = [
        httpx.URL(u)
        for u in (
            "https://east.example/v1",
            "https://east.example/v2",
            "https://east.example/v1/",
            "https://west.example",
            "https://south.example/model/claude-v1:0",
            "https://south.example/model/claude-v1%3A0",
        )
    ]
    assert own(httpx.URL(url), bases) == expected
    outside, _ = Reach(bases).where("POST", httpx.URL(url), signed=True)
    assert outside == tuple(i for i in range(len(bases)) if i not in expected)
    for i in expected:  # sent as it is
        assert rebase(httpx.URL(url), bases[i], tuple(bases)).raw_path == httpx.URL(url).raw_path
    assert Reach(bases).serves_signed(httpx.URL(url)) is bool(expected)
