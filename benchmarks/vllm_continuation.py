"""Mid-stream failover by continuation against a real vLLM server.

Needs a vLLM (0.32) OpenAI-compatible server on loopback, serving any model:

    python -m benchmarks.vllm_continuation --vllm http://127.0.0.1:8031 [--cut-after 8] [--max-tokens 24]

The guard's two replicas are two loopback proxies (`benchmarks._cutting_proxy`) in front of the **same** vLLM
engine (one engine is enough: what is tested is vLLM's handling of the continuation request, not a second
machine). The first stream either proxy carries is reset after ``--cut-after`` server-sent events; the guard
(`ContinuationPolicy()` on) sends the rest of the request to the other proxy. For ``/v1/chat/completions`` and
``/v1/completions``, through the openai SDK, streamed, it prints the text before the cut and the continuation's
text, the role deltas, ids and ``[DONE]`` markers in the bytes the SDK read, the usage, the attempt trail, and
the continuation request as vLLM received it with vLLM's status line for it. It exits 1 if a check fails, and
0 with a message, checking nothing, when no server URL is given (``--vllm`` or ``LLMGUARD_VLLM_URL``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import httpx2
import openai

from benchmarks._cutting_proxy import Cut, CuttingProxy
from llmguard_client import ContinuationPolicy, Guard, PhaseRecord, Tier
from llmguard_client.edges.httpx2_async import Httpx2GuardTransport

SHOWN = ("max_tokens", "continue_final_message", "add_generation_prompt")
PROMPTS = {"chat": "Tell me a long story about a lighthouse.", "completions": "Once upon a time, in a lighthouse,"}


class _TapStream(httpx.AsyncByteStream):
    """The guard's body, a copy of each chunk kept as the caller reads it (a plain iterator, not a generator:
    the SDK leaves its first iteration suspended at ``[DONE]``)."""

    def __init__(self, inner: httpx.AsyncByteStream, raw: bytearray) -> None:
        self._inner, self._raw = inner, raw
        self._chunks: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> _TapStream:
        self._chunks = self._inner.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        assert self._chunks is not None
        chunk = await self._chunks.__anext__()
        self._raw += chunk
        return chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class Tap(httpx.AsyncBaseTransport):
    """The guard's transport, keeping a copy of the response bytes the caller (the SDK) read."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.raw = bytearray()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_TapStream(response.stream, self.raw),
            extensions=response.extensions,
        )


async def tokenize(http: httpx.AsyncClient, kind: str, body: dict[str, Any]) -> tuple[int, list[str]]:
    """vLLM's own prompt for a request as sent (its /tokenize endpoint): token count and token strings."""
    keys = ("messages", "continue_final_message", "add_generation_prompt") if kind == "chat" else ("prompt",)
    query: dict[str, Any] = {"model": body["model"], "return_token_strs": True}
    query.update({k: body[k] for k in keys if k in body})
    answer = (await http.post("/tokenize", json=query)).raise_for_status().json()
    return int(answer["count"]), list(answer.get("token_strs") or [])


def request_body(sent: bytes | bytearray) -> dict[str, Any] | None:
    """The JSON body of the first request in a connection's bytes."""
    head, sep, rest = bytes(sent).partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"POST"):
        return None
    obj, _ = json.JSONDecoder().raw_decode(rest.decode())
    return obj if isinstance(obj, dict) else None


async def run(
    kind: str, base: str, urls: list[str], proxies: list[CuttingProxy], cut: Cut, args: argparse.Namespace
) -> bool:
    print(f"\n=== {kind}: /v1/{'chat/' if kind == 'chat' else ''}completions, cut after {args.cut_after} events")
    for proxy in proxies:
        proxy.exchanges.clear()
    cut.done = 0
    cut.arm(args.cut_after)
    records: list[PhaseRecord] = []
    tiers = {"t": Tier(ttft=30.0, total=120.0, stall=30.0)}
    policy = ContinuationPolicy()
    async with Guard(urls, tiers=tiers, hedge=None, continuation=policy, instrumentation=None,
                     on_record=records.append) as guard:  # fmt: skip
        tap = Tap(guard.transport)
        # openai >= 3 takes an httpx2 client: the guard's httpx2 edge (what guard.httpx2_client() builds) over the tap,
        # with the SDK's own timeout, as guard.httpx2_client() keeps it.
        async with httpx2.AsyncClient(transport=Httpx2GuardTransport(tap), timeout=openai.DEFAULT_TIMEOUT) as http:
            oai = openai.AsyncOpenAI(base_url=urls[0] + "/v1", api_key="sk", http_client=http, max_retries=0)
            options: dict[str, Any] = {
                "model": "tiny-llama",
                "max_tokens": args.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "extra_body": {"ignore_eos": True},  # random weights: generate exactly max_tokens
            }
            if kind == "chat":
                messages: Any = [{"role": "user", "content": PROMPTS[kind]}]
                stream: Any = await oai.chat.completions.create(messages=messages, **options)
            else:
                stream = await oai.completions.create(prompt=PROMPTS[kind], **options)
            chunks = [chunk async for chunk in stream]
    (record,) = records
    if kind == "chat":
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = "".join(c.choices[0].text for c in chunks if c.choices)
    events = [e[6:] for e in bytes(tap.raw).split(b"\n\n") if e.startswith(b"data: ")]
    objs = [json.loads(e) for e in events if e != b"[DONE]"]
    roles = sum(1 for o in objs for c in o.get("choices", []) if "role" in (c.get("delta") or {}))
    usage = chunks[-1].usage
    port_of = {urlsplit(p.url).port: p for p in proxies}

    print("attempt trail:")
    for a in record.attempts:
        proxy = port_of[urlsplit(a.replica).port]
        extra = ""
        if a.kind == "continuation":
            extra = f" resumed_at={a.resumed_at} chars, resumed_tokens={a.resumed_tokens}, break_cause={a.break_cause}"
        print(f"  {a.index}: kind={a.kind} replica={proxy.name} outcome={a.outcome} status={a.status_code}"
              f" error={a.error}{extra}")  # fmt: skip
    print(f"record: status={record.status} continued={record.continued} not_continued={record.not_continued}"
          f" completion_tokens={record.completion_tokens}")  # fmt: skip
    continuation = next((a for a in record.attempts if a.kind == "continuation"), None)
    at = continuation.resumed_at if continuation is not None and continuation.resumed_at is not None else len(text)
    print(f"text before the cut ({at} chars): {text[:at]!r}")
    print(f"continuation text ({len(text) - at} chars): {text[at:]!r}")
    indexes = sorted({c.get("index") for o in objs for c in o.get("choices", [])})
    print(f"bytes the SDK read: {len(events)} events, [DONE] x{events.count(b'[DONE]')}, role deltas x{roles}, "
          f"ids {sorted({o.get('id') for o in objs})}, choice indexes {indexes}")  # fmt: skip
    print(f"usage (last chunk): {usage.model_dump() if usage is not None else None}")
    sent = []
    for proxy in proxies:
        for exchange in proxy.exchanges:
            body = request_body(exchange.sent)
            if body is not None:
                sent.append((proxy.name, exchange, body))
                keys = {k: body[k] for k in SHOWN if k in body}
                last = body["messages"][-1] if kind == "chat" else {"prompt": body["prompt"]}
                print(f"  {proxy.name} forwarded {keys} last={json.dumps(last)[:160]} -> vLLM answered "
                      f"{exchange.statuses} {'(cut by the proxy)' if exchange.cut else ''}")  # fmt: skip

    original = next((b for _, e, b in sent if e.cut), None)
    resumed = next((b for _, e, b in sent if not e.cut), None)
    counts = []
    async with httpx.AsyncClient(base_url=base, timeout=30.0) as http:
        for label, body in (("original request", original), ("continuation request", resumed)):
            if body is None:
                continue
            count, strs = await tokenize(http, kind, body)
            counts.append(count)
            print(f"  vLLM /tokenize of the {label} as sent: {count} prompt tokens, ending {strs[-6:]}")
    if len(counts) == 2:
        print(f"  the delivered text re-tokenized: {counts[1] - counts[0]} tokens (generated before the cut: "
              f"{continuation.resumed_tokens if continuation else None})")  # fmt: skip

    checks = {
        "one stream was cut": cut.done == 1 and sum(e.cut for p in proxies for e in p.exchanges) == 1,
        "attempts: primary failed, continuation won": [(a.kind, a.outcome) for a in record.attempts]
        == [("primary", "failed"), ("continuation", "won")],
        "the continuation went to the other replica": len({a.replica for a in record.attempts}) == 2,
        "vLLM accepted the continuation (200)": continuation is not None
        and continuation.status_code == 200
        and any(not e.cut and e.statuses == ["HTTP/1.1 200 OK"] for _, e, _ in sent),
        "text before the cut is non-empty, continuation non-empty": 0 < at < len(text),
        "one [DONE], last": events.count(b"[DONE]") == 1 and events[-1] == b"[DONE]",
        "one response id, choice index 0": len({o.get("id") for o in objs}) == 1 and indexes == [0],
        "usage: completion tokens == max_tokens (ignore_eos), total == prompt + completion": usage is not None
        and usage.completion_tokens == args.max_tokens
        and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
        "record ok and continued": record.status == "ok" and record.continued,
    }
    if kind == "chat":
        checks["one role delta"] = roles == 1
        checks["chat continuation sent continue_final_message / add_generation_prompt"] = any(
            b.get("continue_final_message") is True and b.get("add_generation_prompt") is False for _, _, b in sent
        )
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAILED'}] {name}")
    if usage is not None and counts:
        # Not a check: the first part's usage never arrived, so the guard reports the continuation's prompt tokens
        # less the tokens generated before the cut, exact only if the delivered text re-tokenizes to as many.
        same = "equal" if usage.prompt_tokens == counts[0] else "NOT equal (re-tokenization, see the docs)"
        print(f"  [note] usage prompt_tokens {usage.prompt_tokens} vs the original request's {counts[0]}: {same}")
    return all(checks.values())


async def main(args: argparse.Namespace) -> int:
    base = args.vllm.rstrip("/")
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            healthy = (await http.get(base + "/health")).status_code == 200
    except httpx.HTTPError:
        healthy = False
    if not healthy:
        print(f"vllm_continuation: no healthy vLLM server at {base} (GET /health failed); nothing checked")
        return 1
    port = urlsplit(base).port
    assert port is not None, f"--vllm needs an explicit port, got {base!r}"
    cut = Cut()
    proxies = [CuttingProxy(f"proxy-{name}", port, cut) for name in "ab"]
    ok = True
    async with anyio.create_task_group() as tg:
        for proxy in proxies:
            await tg.start(proxy.serve)
        print(f"vLLM {base}; the guard's replicas: {', '.join(f'{p.name} {p.url}' for p in proxies)} "
              "(two proxies, ONE engine)")  # fmt: skip
        for kind in args.kinds:
            ok = await run(kind, base, [p.url for p in proxies], proxies, cut, args) and ok
        tg.cancel_scope.cancel()
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", default=os.environ.get("LLMGUARD_VLLM_URL", ""),
                        help="vLLM's base URL, e.g. http://127.0.0.1:8031 (default: $LLMGUARD_VLLM_URL)")  # fmt: skip
    parser.add_argument("--cut-after", type=int, default=8, help="server-sent events before the cut (default 8)")
    parser.add_argument("--max-tokens", type=int, default=24, help="max_tokens of each call (default 24)")
    parser.add_argument("--kinds", type=lambda s: s.split(","), default=["chat", "completions"],
                        help="chat,completions (default both)")  # fmt: skip
    args = parser.parse_args()
    if not args.vllm:
        print("vllm_continuation: skipped: no vLLM server given (--vllm URL or LLMGUARD_VLLM_URL); see the docstring")
        return 0
    return anyio.run(main, args)


if __name__ == "__main__":
    sys.exit(cli())
