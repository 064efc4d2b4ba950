"""`Splicer`: a continuation's events rewritten into the original answer's, however the bytes are split."""

from __future__ import annotations

import json
from typing import Any

from llmguard_client.protocols.splice import Splicer


def event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def delta(content: str, **extra: Any) -> dict[str, Any]:
    return {"id": "cont-1", "choices": [{"index": 3, "delta": {"content": content}, **extra}]}


def splicer() -> Splicer:
    return Splicer("chat", "orig-1", tokens_before=5, prompt_tokens=10)


def spliced(*parts: bytes) -> tuple[bytes, Splicer]:
    s = splicer()
    out = b"".join(s.rewrite(part) for part in parts) + s.flush()
    return out, s


def test_events_take_the_original_id_and_choice_index_and_usage_adds_up() -> None:
    usage = {"id": "cont-1", "choices": [], "usage": {"prompt_tokens": 15, "completion_tokens": 2}}
    out, s = spliced(
        event({"id": "cont-1", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + event(delta("lo"))
    )
    more, _ = spliced(event(usage))
    assert out == event_compact({"id": "orig-1", "choices": [{"index": 0, "delta": {"content": "lo"}}]})
    assert s.text == ["lo"]
    assert json.loads(more[6:])["usage"] == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17}


def test_a_multi_megabyte_event_in_many_chunks_is_spliced_as_when_whole() -> None:
    raw = event(delta("iVBORw0KGgo" * (2 * 2**20 // 11))) + b"data: [DONE]\n\n"
    whole, _ = spliced(raw)
    chunked, s = spliced(*(raw[i : i + 65536] for i in range(0, len(raw), 65536)))
    assert chunked == whole and whole.endswith(b"data: [DONE]\n\n") and b'"id":"orig-1"' in whole
    assert s.text_events == 1


def test_an_unterminated_last_event_held_over_many_chunks_is_flushed_whole() -> None:
    raw = event(delta("x" * 300_000))[:-2]  # no blank line: the stream ended inside it
    whole, _ = spliced(raw)
    chunked, _ = spliced(*(raw[i : i + 4096] for i in range(0, len(raw), 4096)))
    assert (
        chunked
        == whole
        == event_compact({"id": "orig-1", "choices": [{"index": 0, "delta": {"content": "x" * 300_000}}]})
    )


def event_compact(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def test_a_crlf_split_between_cr_and_lf_does_not_split_an_event() -> None:
    """A multi-line event with CRLF line endings, cut between a CR and its LF: one event, as when whole."""
    lines = json.dumps(delta("two lines"), indent=1).encode().split(b"\n")
    raw = b"".join(b"data: " + line + b"\r\n" for line in lines) + b"\r\n"
    cut = raw.index(b"\r\n") + 1  # after the first line's CR
    whole, _ = spliced(raw)
    chunked, s = spliced(raw[:cut], raw[cut:])
    assert chunked == whole and b'"id":"orig-1"' in whole and s.text == ["two lines"]
