"""A Jupyter notebook (a real ipykernel) whose cells use one Guard's sync and async openai clients in turn: every
cell is served, as without a guard (``-m frameworks``; needs ``pip install ipykernel jupyter_client nest_asyncio``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.loopback import LoopbackServer

pytestmark = pytest.mark.frameworks
pytest.importorskip("ipykernel")
manager = pytest.importorskip("jupyter_client.manager")

SETUP = """
import openai
from llmguard_client import Guard
guard = Guard([{url!r}])
aclient = openai.AsyncOpenAI(base_url={url!r} + "/v1", api_key="k", max_retries=0,
                             http_client=guard.http_client_for(openai.AsyncOpenAI))
client = openai.OpenAI(base_url={url!r} + "/v1", api_key="k", max_retries=0,
                       http_client=guard.http_client_for(openai.OpenAI))
ASK = dict(model="m", messages=[{{"role": "user", "content": "hi"}}], max_tokens=3)
"""
AWAITED = "(await aclient.chat.completions.create(**ASK)).choices[0].message.content"
SYNC = "client.chat.completions.create(**ASK).choices[0].message.content"
SYNC_STREAM = "''.join(c.choices[0].delta.content or '' for c in client.chat.completions.create(**ASK, stream=True))"


@pytest.fixture
def kernel() -> Iterator[Any]:
    kernel_manager, kernel_client = manager.start_new_kernel(kernel_name="python3")
    try:
        yield kernel_client
    finally:
        kernel_client.stop_channels()
        kernel_manager.shutdown_kernel(now=True)


def run_cell(kernel: Any, code: str) -> str:
    """The cell's result (its last expression's repr), or its error as ``Name: message``."""
    messages: list[dict[str, Any]] = []
    kernel.execute_interactive(code, timeout=60, output_hook=messages.append)
    for message in messages:
        if message["msg_type"] == "execute_result":
            return str(message["content"]["data"]["text/plain"])
        if message["msg_type"] == "error":
            return f"{message['content']['ename']}: {message['content']['evalue']}"
    return ""


def test_cells_that_await_and_cells_that_call_the_sync_client_are_all_served(
    servers: list[LoopbackServer], kernel: Any
) -> None:
    """Before, each sync cell after an awaited one failed: BadRequestError (the Guard's WrongEventLoop)."""
    assert run_cell(kernel, SETUP.format(url=servers[0].url)) == ""
    answers = [run_cell(kernel, cell) for cell in (AWAITED, SYNC, AWAITED, SYNC_STREAM, SYNC, AWAITED)]
    assert answers == ["'hello'", "'hello'", "'hello'", "' t0 t1 t2 t3 t4'", "'hello'", "'hello'"]
    assert run_cell(kernel, "await guard.aclose(); guard.closed") == "True"
    assert len(servers[0].received) == 6


def test_after_nest_asyncio_an_awaited_cell_after_a_sync_one_is_served(
    servers: list[LoopbackServer], kernel: Any
) -> None:
    """``nest_asyncio.apply()`` (which many notebooks run) drives every loop without the async generator hooks, the
    Guard's own included: the awaited cell after a sync one hung the kernel for good (a lock taken twice on one
    thread), where the plain SDK serves it."""
    assert run_cell(kernel, "import nest_asyncio; nest_asyncio.apply()") == ""
    assert run_cell(kernel, SETUP.format(url=servers[0].url)) == ""
    answers = [run_cell(kernel, cell) for cell in (SYNC, AWAITED, SYNC_STREAM, AWAITED, "guard.close()")]
    assert answers == ["'hello'", "'hello'", "' t0 t1 t2 t3 t4'", "'hello'", ""]
