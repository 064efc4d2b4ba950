"""The baselines the guard is compared with: what callers write without it.

* ``plain``           httpx.AsyncClient, one attempt, round-robin over the replicas.
* ``openai-default``  the real ``openai.AsyncOpenAI`` with its defaults (``max_retries=2``, honours
                      Retry-After up to 60 s), one SDK client per replica, round-robin.
* ``naive-retry``     what users write today: a tenacity loop retrying 429 / 5xx / connection errors up
                      to 3 times (4 attempts) with short exponential backoff (0.1 s, 0.2 s, 0.4 s, no
                      jitter, Retry-After ignored), each attempt to the next replica. It only retries
                      before the first token: after that, a retry would repeat text the user has seen.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from llmguard_tools.bench.client_base import BenchClient
from llmguard_tools.bench.measure import HTTPStatus, Probe, consume_sse, count_attempt
from llmguard_tools.bench.tls import tls_context

__all__ = ["POOL_LIMITS", "NaiveRetryClient", "OpenAIDefaultClient", "PlainClient", "stream_once"]

POOL_LIMITS = httpx.Limits(max_connections=4096, max_keepalive_connections=512, keepalive_expiry=5.0)


async def stream_once(http: httpx.AsyncClient, url: str, body: dict[str, Any], probe: Probe) -> httpx.Response:
    async with http.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise HTTPStatus(response.status_code, response.headers.get("x-llmguard-cause"))
        await consume_sse(response, probe)
        return response


class PlainClient(BenchClient):
    name = "plain"

    async def start(self) -> None:
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(self.deadline),
            limits=POOL_LIMITS,
            headers=self.headers,
            event_hooks={"request": [count_attempt]},
            verify=tls_context(),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, body: dict[str, Any], probe: Probe) -> None:
        await stream_once(self._http, self.next_url() + "/v1/chat/completions", body, probe)


class NaiveRetryClient(PlainClient):
    name = "naive-retry"
    RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

    async def _send(self, body: dict[str, Any], probe: Probe) -> None:
        from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

        def retryable(exc: BaseException) -> bool:
            if probe.first_token is not None:
                return False
            if isinstance(exc, HTTPStatus):
                return exc.status in self.RETRY_STATUSES
            return isinstance(exc, httpx.TransportError)

        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(4),
            wait=wait_exponential(multiplier=0.1, min=0.1, max=1.0),
            retry=retry_if_exception(retryable),
            reraise=True,
        ):
            with attempt:
                await stream_once(self._http, self.next_url() + "/v1/chat/completions", body, probe)


class OpenAIDefaultClient(BenchClient):
    name = "openai-default"

    async def start(self) -> None:
        import openai

        self._openai = openai
        self._clients = [
            openai.AsyncOpenAI(
                base_url=u + "/v1",
                api_key=self.api_key or "bench",
                http_client=openai.DefaultAsyncHttpxClient(
                    event_hooks={"request": [count_attempt]}, verify=tls_context()
                ),
            )
            for u in self.urls
        ]

    async def aclose(self) -> None:
        for c in self._clients:
            await c.close()

    async def _send(self, body: dict[str, Any], probe: Probe) -> None:
        client = self._clients[next(self._rr)]
        stream = await client.chat.completions.create(
            model=body["model"],
            messages=body["messages"],
            max_tokens=body["max_tokens"],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": body.get("ignore_eos", True)},
        )
        try:
            async for chunk in stream:
                for choice in chunk.choices:
                    if choice.delta is not None and choice.delta.content:
                        if probe.first_token is None:
                            probe.first_token = time.perf_counter()
                        probe.content_chunks += 1
                if chunk.usage is not None:
                    probe.usage_completion = chunk.usage.completion_tokens
                    probe.usage_prompt = chunk.usage.prompt_tokens
        finally:
            await stream.close()
        probe.done = True

    def classify(self, exc: Exception, probe: Probe) -> tuple[str, int | None, str | None]:
        oa = self._openai
        if isinstance(exc, oa.APITimeoutError):
            return "timeout", None, "APITimeoutError"
        if isinstance(exc, oa.APIStatusError):
            return f"http_{exc.status_code}", exc.status_code, exc.response.headers.get("x-llmguard-cause")
        if isinstance(exc, oa.APIConnectionError):
            return "error", None, f"APIConnectionError: {exc.__cause__ or exc}"[:160]
        return super().classify(exc, probe)
