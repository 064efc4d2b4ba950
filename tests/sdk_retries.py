"""A Guard at a 50 % rollout whose one replica fails each call's first request and serves its retry (`failing_once`),
and an SDK call as such a client sends it (`sdk_call`): the guard hands each failure back (``retry=None``), so the
SDK's retry follows in both cohorts."""

from __future__ import annotations

from typing import Any

import httpx

from llmguard_client import Guard, Replica, Tier

URL = "http://r1.test:8000"


def failing_once(**kwargs: Any) -> Guard:
    """The Guard (``kwargs``: its instrumentation, ``on_record``...)."""
    answered: set[bytes] = set()

    def transport(replica: Replica) -> httpx.AsyncBaseTransport:
        async def handler(request: httpx.Request) -> httpx.Response:
            body = await request.aread()
            if body not in answered:
                answered.add(body)
                return httpx.Response(500, json={"error": {"message": "once"}})
            return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}]})

        return httpx.MockTransport(handler)

    tiers = {"interactive": Tier(ttft=60.0, total=120.0)}
    return Guard([URL], rollout=0.5, tiers=tiers, hedge=None, retry=None, transport_factory=transport, **kwargs)


async def sdk_call(client: httpx.AsyncClient, i: int) -> None:
    """Call ``i``: its first request (failed) and the SDK's retry of it (served), as an SDK that counts them sends."""
    body = {"model": "m", "messages": [{"role": "user", "content": f"call {i}"}]}
    for retry in range(2):
        headers = {"x-stainless-retry-count": str(retry)}
        await client.post(URL + "/v1/chat/completions", json=body, headers=headers)
