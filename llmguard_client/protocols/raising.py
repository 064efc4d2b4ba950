"""A `StreamFailure` as the typed exception the caller (or `AllAttemptsFailed.__cause__`) gets."""

from __future__ import annotations

import httpx

from llmguard_client.errors import GuardStreamError, StreamTruncated, UpstreamStreamError
from llmguard_client.protocols.base import StreamFailure
from llmguard_client.telemetry._record_builder import AnyCall

_WHAT = {
    "error_event": "reported an error inside its stream",
    "error_body": "answered 200 with an error body",
    "malformed": "sent a malformed event",
    "json_body": "answered a plain JSON body where a stream was asked for",
    "not_sse": "answered a body that is not an event stream where a stream was asked for",
    "truncated": "ended the stream early",
}


def stream_error(
    failure: StreamFailure,
    *,
    replica: str,
    request: httpx.Request | None = None,
    record: AnyCall | None = None,
    after_first_token: bool,
) -> GuardStreamError:
    """The exception for ``failure`` on ``replica``; its message says what, where and when."""
    when = "after the first token" if after_first_token else "before the first token"
    code = f" (code {failure.code})" if failure.code else ""
    message = f"replica {replica} {_WHAT[failure.kind]} {when}: {failure.message}{code}"
    cls: type[GuardStreamError]
    if failure.kind == "truncated":
        cls = StreamTruncated
    elif failure.kind in ("error_event", "error_body"):
        cls = UpstreamStreamError
    else:
        cls = GuardStreamError
    return cls(
        message,
        cause=failure.cause,
        code=failure.code,
        overload=failure.overload,
        request=request,
        record=record,
        retry_after=failure.retry_after,
    )
