"""One cell of the compatibility matrix: run inside a venv, print one JSON object.

    python scripts/compat_probe.py

For each client kind installed (openai through ``guard.http_client_for``, plain httpx, httpx2),
async and sync, against a loopback server: a non-streamed call, a streamed call (and its phase
record through ``guard.capture()``), and a give-up (no first token within the tier's ttft) with
the server's request count, in the default mode (openai's own retries on) and in raise mode with
``max_retries=0``.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# tests.loopback encodes with the simulator's wire (llmguard_tools, in tools/): the cells install the runtime only.
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tools"))

from llmguard_client import FailureMode, Guard, Tier, guard_failure
from tests.loopback import LoopbackServer, Script

MESSAGES: Any = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": MESSAGES}
EXPECTED = " t0 t1 t2 t3 t4"
FAST = {"fast": Tier(ttft=0.3, total=5.0)}


def version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def outcome(check: Callable[[], str]) -> str:
    try:
        return check()
    except Exception as exc:
        return f"FAIL {type(exc).__name__}: {str(exc)[:160]}"


def ok_if(condition: bool, detail: str) -> str:
    return "ok" if condition else f"FAIL {detail}"


class Probe:
    def __init__(self, server: LoopbackServer) -> None:
        self.server = server
        self.url = server.url

    def fresh(self, script: Script | None = None) -> None:
        self.server.reset()
        if script is not None:
            self.server.script = script

    # --- openai -------------------------------------------------------------------------

    def openai_sync(self) -> dict[str, str]:
        import openai

        def client(guard: Guard, **kw: Any) -> Any:
            return openai.OpenAI(
                base_url=self.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.OpenAI), **kw
            )

        def plain() -> str:
            self.fresh()
            with Guard([self.url], instrumentation=None) as guard:
                done = client(guard).chat.completions.create(model="m", messages=MESSAGES)
            return ok_if(done.choices[0].message.content == "hello", repr(done))

        def streamed() -> str:
            self.fresh()
            with Guard([self.url], instrumentation=None) as guard, guard.capture() as calls:
                stream = client(guard).chat.completions.create(model="m", messages=MESSAGES, stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            return (
                ok_if(text == EXPECTED and len(calls) == 1, f"{text!r} {len(calls)}") + f" (record: {calls[0].status})"
            )

        def give_up(mode: FailureMode, retries: int, expected: type[BaseException], requests: int = 1) -> str:
            self.fresh(Script(hang_before_headers=1.5))
            with Guard([self.url], tiers=FAST, retry=None, failure_mode=mode, instrumentation=None) as guard:
                try:
                    client(guard, max_retries=retries).chat.completions.create(model="m", messages=MESSAGES)
                    return "FAIL no error"
                except openai.APIError as exc:
                    seen = len(self.server.received)
                    good = (
                        isinstance(exc, expected)
                        and guard_failure(exc) == "ttft_timeout"
                        and (seen > 1 if requests > 1 else seen == 1)
                    )
                    return (
                        ok_if(good, f"{type(exc).__name__} cause={guard_failure(exc)}")
                        + f" ({type(exc).__name__}, server requests {seen})"
                    )

        return {
            "non-streamed": outcome(plain),
            "streamed": outcome(streamed),
            "give up, default (max_retries=2)": outcome(lambda: give_up("auto", 2, openai.APITimeoutError)),
            "give up, raise + max_retries=0": outcome(lambda: give_up("raise", 0, openai.APITimeoutError)),
            "raise + max_retries=2 (stopped)": outcome(lambda: give_up("raise", 2, openai.APITimeoutError)),
        }

    async def openai_async(self) -> dict[str, str]:
        import openai

        def client(guard: Guard, **kw: Any) -> Any:
            return openai.AsyncOpenAI(
                base_url=self.url + "/v1", api_key="k", http_client=guard.http_client_for(openai.AsyncOpenAI), **kw
            )

        results: dict[str, str] = {}

        async def run(name: str, check: Callable[[], Any]) -> None:
            try:
                results[name] = await check()
            except Exception as exc:
                results[name] = f"FAIL {type(exc).__name__}: {str(exc)[:160]}"

        async def plain() -> str:
            self.fresh()
            async with Guard([self.url], instrumentation=None) as guard:
                done = await client(guard).chat.completions.create(model="m", messages=MESSAGES)
            return ok_if(done.choices[0].message.content == "hello", repr(done))

        async def streamed() -> str:
            self.fresh()
            async with Guard([self.url], instrumentation=None) as guard:
                with guard.capture() as calls:
                    stream = await client(guard).chat.completions.create(model="m", messages=MESSAGES, stream=True)
                    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            return (
                ok_if(text == EXPECTED and len(calls) == 1, f"{text!r} {len(calls)}") + f" (record: {calls[0].status})"
            )

        async def give_up(mode: FailureMode, retries: int, expected: type[BaseException], requests: int = 1) -> str:
            self.fresh(Script(hang_before_headers=1.5))
            async with Guard([self.url], tiers=FAST, retry=None, failure_mode=mode, instrumentation=None) as guard:
                try:
                    await client(guard, max_retries=retries).chat.completions.create(model="m", messages=MESSAGES)
                    return "FAIL no error"
                except openai.APIError as exc:
                    seen = len(self.server.received)
                    good = (
                        isinstance(exc, expected)
                        and guard_failure(exc) == "ttft_timeout"
                        and (seen > 1 if requests > 1 else seen == 1)
                    )
                    return (
                        ok_if(good, f"{type(exc).__name__} cause={guard_failure(exc)}")
                        + f" ({type(exc).__name__}, server requests {seen})"
                    )

        await run("non-streamed", plain)
        await run("streamed", streamed)
        await run("give up, default (max_retries=2)", lambda: give_up("auto", 2, openai.APITimeoutError))
        await run("give up, raise + max_retries=0", lambda: give_up("raise", 0, openai.APITimeoutError))
        await run("raise + max_retries=2 (stopped)", lambda: give_up("raise", 2, openai.APITimeoutError))
        return results

    # --- anthropic (no /v1/messages on the loopback server: replicas that refuse connections, which the SDK
    # raises as its connection error in every failure mode, as without a guard) ----

    def anthropic_checks(self) -> dict[str, str]:
        import socket

        import anthropic

        with socket.socket() as sock:  # bound, then closed: nothing listens there
            sock.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{sock.getsockname()[1]}"

        def sync(mode: FailureMode) -> str:
            with Guard([dead], retry=None, failure_mode=mode, instrumentation=None) as guard:
                http = guard.http_client_for(anthropic.Anthropic)
                client = anthropic.Anthropic(base_url=dead, api_key="k", max_retries=0, http_client=http)
                try:
                    client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
                    return "FAIL no error"
                except anthropic.APIError as exc:
                    good = isinstance(exc, anthropic.APIConnectionError) and guard_failure(exc) == "all_attempts_failed"
                    return ok_if(good, f"{type(exc).__name__} cause={guard_failure(exc)}") + f" ({type(exc).__name__})"

        async def asynchronous(mode: FailureMode) -> str:
            async with Guard([dead], retry=None, failure_mode=mode, instrumentation=None) as guard:
                http = guard.http_client_for(anthropic.AsyncAnthropic)
                client = anthropic.AsyncAnthropic(base_url=dead, api_key="k", max_retries=0, http_client=http)
                try:
                    await client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
                    return "FAIL no error"
                except anthropic.APIError as exc:
                    good = isinstance(exc, anthropic.APIConnectionError) and guard_failure(exc) == "all_attempts_failed"
                    return ok_if(good, f"{type(exc).__name__} cause={guard_failure(exc)}") + f" ({type(exc).__name__})"

        return {
            "async, replicas refuse, default mode": outcome(lambda: anyio.run(asynchronous, "auto")),
            "async, replicas refuse, raise mode": outcome(lambda: anyio.run(asynchronous, "raise")),
            "sync, replicas refuse, default mode": outcome(lambda: sync("auto")),
            "sync, replicas refuse, raise mode": outcome(lambda: sync("raise")),
        }

    # --- plain clients ------------------------------------------------------------------

    def plain_sync(self, flavor: str) -> dict[str, str]:
        def make(guard: Guard) -> Any:
            return guard.sync_http_client() if flavor == "httpx" else guard.sync_httpx2_client()

        def plain() -> str:
            self.fresh()
            with Guard([self.url], instrumentation=None) as guard, make(guard) as http:
                response = http.post(self.url + "/v1/chat/completions", json=BODY)
            return ok_if(response.json()["choices"][0]["message"]["content"] == "hello", response.text[:80])

        def streamed() -> str:
            self.fresh()
            url = self.url + "/v1/chat/completions"
            with (
                Guard([self.url], instrumentation=None) as guard,
                make(guard) as http,
                guard.capture() as calls,
                http.stream("POST", url, json={**BODY, "stream": True}) as r,
            ):
                events = [line for line in r.iter_lines() if line.startswith("data: ")]
            return (
                ok_if(len(events) == 8 and calls[0].status == "ok", f"{len(events)} {calls}")
                + f" (record: {calls[0].status})"
            )

        def give_up() -> str:
            self.fresh(Script(hang_before_headers=1.5))
            with Guard([self.url], tiers=FAST, retry=None, instrumentation=None) as guard, make(guard) as http:
                try:
                    http.post(self.url + "/v1/chat/completions", json=BODY)
                    return "FAIL no error"
                except Exception as exc:
                    seen = len(self.server.received)
                    return (
                        ok_if(guard_failure(exc) == "ttft_timeout" and seen == 1, repr(exc))
                        + f" ({type(exc).__name__}, server requests {seen})"
                    )

        return {"non-streamed": outcome(plain), "streamed": outcome(streamed), "give up (raise)": outcome(give_up)}

    async def plain_async(self, flavor: str) -> dict[str, str]:
        results: dict[str, str] = {}

        def make(guard: Guard) -> Any:
            return guard.http_client() if flavor == "httpx" else guard.httpx2_client()

        async def plain() -> str:
            self.fresh()
            async with Guard([self.url], instrumentation=None) as guard, make(guard) as http:
                response = await http.post(self.url + "/v1/chat/completions", json=BODY)
            return ok_if(response.json()["choices"][0]["message"]["content"] == "hello", response.text[:80])

        async def streamed() -> str:
            self.fresh()
            async with Guard([self.url], instrumentation=None) as guard, make(guard) as http:
                with guard.capture() as calls:
                    async with http.stream(
                        "POST", self.url + "/v1/chat/completions", json={**BODY, "stream": True}
                    ) as r:
                        events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            return (
                ok_if(len(events) == 8 and calls[0].status == "ok", f"{len(events)} {calls}")
                + f" (record: {calls[0].status})"
            )

        async def give_up() -> str:
            self.fresh(Script(hang_before_headers=1.5))
            async with Guard([self.url], tiers=FAST, retry=None, instrumentation=None) as guard, make(guard) as http:
                try:
                    await http.post(self.url + "/v1/chat/completions", json=BODY)
                    return "FAIL no error"
                except Exception as exc:
                    seen = len(self.server.received)
                    return (
                        ok_if(guard_failure(exc) == "ttft_timeout" and seen == 1, repr(exc))
                        + f" ({type(exc).__name__}, server requests {seen})"
                    )

        for name, check in (("non-streamed", plain), ("streamed", streamed), ("give up (raise)", give_up)):
            try:
                results[name] = await check()
            except Exception as exc:
                results[name] = f"FAIL {type(exc).__name__}: {str(exc)[:160]}"
        return results


def main() -> None:
    server = LoopbackServer("probe")
    server.start()
    probe = Probe(server)
    names = ("openai", "anthropic", "httpx", "httpx2", "anyio", "opentelemetry-api")
    versions = {name: version(name) for name in names}
    report: dict[str, Any] = {"python": platform.python_version(), "versions": versions, "results": {}}
    try:
        results = report["results"]
        results["httpx async"] = anyio.run(probe.plain_async, "httpx")
        results["httpx sync"] = probe.plain_sync("httpx")
        if versions["httpx2"]:
            results["httpx2 async"] = anyio.run(probe.plain_async, "httpx2")
            results["httpx2 sync"] = probe.plain_sync("httpx2")
        if versions["openai"]:
            results["openai async"] = anyio.run(probe.openai_async)
            results["openai sync"] = probe.openai_sync()
        if versions["anthropic"]:
            results["anthropic"] = probe.anthropic_checks()
    except Exception:
        report["crash"] = traceback.format_exc()[-2000:]
    finally:
        server.stop()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
