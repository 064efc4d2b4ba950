"""Locust users that stream chat completions from an OpenAI-compatible endpoint, plain and through a Guard.

Subclass `PlainChatUser` and `GuardedChatUser` in a locustfile (both are abstract) and run them side by
side; ``examples/locustfile.py`` does so against the simulated cluster. Each call is reported to Locust's
statistics (so its tables, ``--csv`` files and master/worker aggregation show it) as:

- request type ``TTFT``, name = the user's ``label``: response time = time to the first content token
  (a failure before it is reported here, with the time until the failure);
- request type ``total``: time to the end of the stream, for the calls that reached their first token.

A failure is a Locust failure whose message names its kind (Locust shows its repr: ``ChatFailure('guard
ttft_timeout')``, ``ChatFailure('guard budget_exhausted (HTTP 503)')``, ``ChatFailure('HTTP 503')``,
``ChatFailure('APIConnectionError')``; see `llmguard_tools.loadtest.streaming.describe_failure`).

Replicas: ``--llm-replicas URL[,URL...]`` (given to the master, Locust passes it on to the workers), else
``--host``. Plain users spread their calls round-robin over the replicas (one ``openai.OpenAI`` per replica);
guarded users send every call to one Guard over all of them. The clients are built once per Locust process
and shared by its users, then closed, with the Guard, when the test stops (``test_stop``) or the process
quits (``quitting``).

gevent: Locust monkey-patches the standard library, so the Guard's sync edge (``guard.sync_httpx2_client()``
under openai >= 3, ``guard.sync_http_client()`` under 1.x/2.x) starts its event-loop "thread" as a greenlet
of the process's one OS thread. That works: the loop waits in gevent's patched selector and the users wait on
gevent's locks and queues, so users and the Guard yield to each other like any greenlets. One limit follows:
asyncio keeps one running loop per OS thread, so a second Guard's loop cannot start in the same process
(and the running loop is visible to the other greenlets). Hence one Guard per Locust process, and one
`GuardedChatUser` class per locustfile.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import openai
from locust import User, events, task
from locust.env import Environment
from locust.event import EventHook
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from llmguard_client import Guard, Tier
from llmguard_tools.loadtest.streaming import StreamResult, stream_chat

__all__ = ["ChatUser", "GuardedChatUser", "PlainChatUser", "close_clients", "replica_urls"]

logger = logging.getLogger("llmguard_tools.loadtest")


def _listen(hook: EventHook, handler: Callable[..., None]) -> None:
    add: Callable[[Callable[..., None]], object] = hook.add_listener  # unannotated in locust
    add(handler)


def _add_arguments(parser: Any, **_: Any) -> None:
    parser.add_argument(
        "--llm-replicas",
        default="",
        help="comma-separated base URLs of the endpoint's replicas, e.g. http://10.0.0.1:8000,http://10.0.0.2:8000 "
        "(default: --host)",
    )


_listen(events.init_command_line_parser, _add_arguments)


def replica_urls(environment: Environment) -> list[str]:
    """The replicas to load: ``--llm-replicas`` if given, else ``--host``; ValueError naming both if neither."""
    options = environment.parsed_options
    raw = str(getattr(options, "llm_replicas", "") or environment.host or "")
    urls = [u.strip().rstrip("/") for u in raw.split(",") if u.strip()]
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if not urls or bad:
        raise ValueError(
            "llmguard loadtest: give the replicas as --llm-replicas http://host:port[,http://host:port...] "
            f"(or --host http://host:port); got {raw!r}"
        )
    return urls


class ChatUser(User):
    """A user streaming chat completions; subclasses say which client sends them (``client_for_call``)."""

    abstract = True
    label: ClassVar[str] = "chat"
    """The name the calls get in Locust's statistics."""
    model: ClassVar[str] = "sim-model"
    max_tokens: ClassVar[int] = 16
    prompt: ClassVar[str] = "Say something about load tests."
    api_key: ClassVar[str] = os.environ.get("OPENAI_API_KEY", "unused")
    max_retries: ClassVar[int] = 2
    """The openai SDK's own retries (its default)."""
    timeout: ClassVar[float] = 60.0
    """The openai SDK's timeout per call, seconds."""

    def client_for_call(self) -> openai.OpenAI:
        """The client that sends the next call."""
        raise NotImplementedError

    def openai_client(self, url: str, http_client: Any = None) -> openai.OpenAI:
        """An ``openai.OpenAI`` for ``url`` (``http_client``: the SDK's own when None)."""
        return openai.OpenAI(
            base_url=url + "/v1",
            api_key=self.api_key,
            max_retries=self.max_retries,
            timeout=self.timeout,
            http_client=http_client,
        )

    def messages(self) -> list[ChatCompletionMessageParam]:
        """The next call's messages (override for a varied workload)."""
        return [{"role": "user", "content": self.prompt}]

    @task
    def chat(self) -> None:
        """Stream one chat completion and report its TTFT (and total time) to Locust."""
        result = stream_chat(
            self.client_for_call(), model=self.model, messages=self.messages(), max_tokens=self.max_tokens
        )
        self.report(result)

    def report(self, result: StreamResult) -> None:
        """Fire Locust's ``request`` event for the TTFT and, if the first token came, for the total."""
        fire = self.environment.events.request.fire
        before_first = result.ttft is None
        ttft = result.total if result.ttft is None else result.ttft
        fire(
            request_type="TTFT",
            name=self.label,
            response_time=ttft * 1000,
            response_length=0,
            exception=result.error if before_first else None,
            context={},
        )
        if not before_first:
            fire(
                request_type="total",
                name=self.label,
                response_time=result.total * 1000,
                response_length=result.chars,
                exception=result.error,
                context={},
            )


class PlainChatUser(ChatUser):
    """Calls straight to the replicas, round-robin, with the openai SDK's own client (no Guard)."""

    abstract = True
    label = "plain"

    def on_start(self) -> None:
        with _lock:
            clients = _clients.get(type(self))
            if clients is None:
                clients = []
                for url in replica_urls(self.environment):
                    clients.append(self.openai_client(url))
                    time.sleep(0)  # gevent: building a client loads the CA bundle; let heartbeats run in between
                _clients[type(self)] = clients
        self._next: Iterator[openai.OpenAI] = itertools.cycle(clients)

    def client_for_call(self) -> openai.OpenAI:
        return next(self._next)


class GuardedChatUser(ChatUser):
    """Calls through this process's Guard (``make_guard``) with ``guard.http_client_for(openai.OpenAI)``."""

    abstract = True
    label = "guarded"
    tier: ClassVar[Tier] = Tier(ttft=1.0, total=10.0, stall=2.0)
    """The deadlines of the default Guard (the same as ``llmguard bench``'s)."""

    @classmethod
    def make_guard(cls, replicas: list[str]) -> Guard:
        """The Guard of this Locust process; override for other policies."""
        return Guard(replicas=replicas, tiers={"loadtest": cls.tier}, default_tier="loadtest")

    def on_start(self) -> None:
        cls = type(self)
        with _lock:  # a gevent lock: the users of one process start concurrently
            if _guard.owner is not None and _guard.owner is not cls:
                raise RuntimeError(
                    f"llmguard loadtest: {cls.__name__} and {_guard.owner.__name__} both want a Guard; a Locust "
                    "process runs one (its sync calls need an asyncio loop, and gevent makes that loop's thread a "
                    "greenlet of the process's one OS thread, where asyncio runs one loop at a time): run one "
                    "GuardedChatUser class per locustfile"
                )
            clients = _clients.get(cls)
            if clients is None:
                urls = replica_urls(self.environment)
                guard = cls.make_guard(urls)
                _guard.owner, _guard.guard = cls, guard
                # The Guard picks the replica of each call; urls[0] only fills in the request's URL.
                clients = _clients[cls] = [self.openai_client(urls[0], guard.http_client_for(openai.OpenAI))]
        self._client = clients[0]

    def client_for_call(self) -> openai.OpenAI:
        return self._client


class _ProcessGuard:
    __slots__ = ("guard", "owner")

    def __init__(self) -> None:
        self.owner: type[ChatUser] | None = None
        self.guard: Guard | None = None


_lock = threading.Lock()
_clients: dict[type[ChatUser], list[openai.OpenAI]] = {}
_guard = _ProcessGuard()


def close_clients(**_: Any) -> None:
    """Close this process's clients and its Guard (the ``test_stop`` and ``quitting`` listeners)."""
    with _lock:
        while _clients:
            for client in _clients.popitem()[1]:
                client.close()
        guard, owner = _guard.guard, _guard.owner
        _guard.guard = _guard.owner = None
    if guard is None or owner is None:
        return
    guard.close()
    snapshot = guard.snapshot()
    if snapshot.idle:
        logger.info("llmguard loadtest: closed the Guard of %s (idle)", owner.__name__)
    else:  # pragma: no cover - a leak in the Guard itself
        logger.warning("llmguard loadtest: the Guard of %s still holds resources: %s", owner.__name__, snapshot)


def _warm_up() -> None:
    """Pay the openai SDK's lazy imports and model building now (the locustfile's import), not in the first
    calls: a worker busy for seconds in one greenlet misses its heartbeats to the master."""
    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused")
    try:
        client.chat.completions.with_raw_response  # noqa: B018 - imports the resource
        ChatCompletionChunk.model_validate(
            {"id": "w", "object": "chat.completion.chunk", "created": 0, "model": "w",
             "choices": [{"index": 0, "delta": {"content": "w"}, "finish_reason": None}]}
        )  # fmt: skip
    finally:
        client.close()
    for edge in ("httpx_sync", "httpx2_sync"):  # openai 1.x/2.x take the first, >= 3 the second (needs httpx2)
        with contextlib.suppress(ImportError):
            importlib.import_module(f"llmguard_client.edges.{edge}")


_warm_up()
_listen(events.test_stop, close_clients)
_listen(events.quitting, close_clients)
