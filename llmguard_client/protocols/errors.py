"""Reading an error object found inside a 200 answer: its status, its code, whether it means overload.

Servers put errors in streams in several shapes, all read here:

- OpenAI / vLLM / SGLang: ``{"error": {"message": ..., "type": "Service Unavailable", "code": 503}}``
- TGI: ``{"error": "Model is overloaded", "error_type": "overloaded"}``
- Anthropic: ``event: error`` + ``{"type": "error", "error": {"type": "overloaded_error", "message": ...}}``
- OpenAI Responses: ``{"type": "error", "code": "server_error", "message": ...}`` and
  ``response.failed`` carrying ``response.error = {"code": ..., "message": ...}``
"""

from __future__ import annotations

import json
import math
from typing import Any

from llmguard_client.protocols.base import FailureKind, StreamFailure

OVERLOAD_STATUSES = frozenset({429, 503, 529})
"""HTTP statuses that mean "this replica is overloaded now, another may not be"."""
OVERLOAD_TYPES = frozenset(
    {
        "overloaded",
        "overloaded_error",
        "server_overloaded",
        "service unavailable",
        "service_unavailable",
        "rate_limit_error",
        "rate_limit_exceeded",
        "too_many_requests",
    }
)
"""Error types / codes (lower-cased) that mean overload."""
_TYPE_STATUS = {
    "invalid_request_error": 400,
    "bad_request": 400,
    "badrequesterror": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "rate_limit_exceeded": 429,
    "too_many_requests": 429,
    "api_error": 500,
    "server_error": 500,
    "internal_server_error": 500,
    "internal_error": 500,
    "internalservererror": 500,
    "service unavailable": 503,
    "service_unavailable": 503,
    "overloaded": 503,
    "server_overloaded": 503,
    "overloaded_error": 529,
}
"""Statuses of well-known error types (Anthropic's documented ones, OpenAI's, vLLM's ``type`` such as
``BadRequestError`` / ``InternalServerError``), used when the error carries no numeric code."""
_MESSAGE_LIMIT = 300


def _status_of(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and 100 <= value <= 599:
        return value
    if isinstance(value, str) and value.isdigit() and 100 <= int(value) <= 599:
        return int(value)
    return None


def _seconds(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def error_failure(
    error: object,
    kind: FailureKind = "error_event",
    error_type: object = None,
    envelope: dict[str, Any] | None = None,
) -> StreamFailure:
    """The `StreamFailure` for one error object (a dict with message/type/code, or a plain string).

    ``error_type`` is a sibling type field (TGI's ``error_type``), used when ``error`` has none. ``envelope`` is
    the event that holds ``error`` when that event is itself shaped as an error answer (Anthropic's ``{"type":
    "error", "error": ...}``): its other keys are kept around the error in the body handed back.
    """
    fields = error if isinstance(error, dict) else {}
    message = fields.get("message") if fields else error
    message = message if isinstance(message, str) else json.dumps(error, default=str)
    type_ = fields.get("type", error_type)
    raw_code = fields.get("code")
    names = [str(v).lower() for v in (type_, raw_code) if isinstance(v, str)]
    status = _status_of(raw_code) or _status_of(fields.get("status"))
    if status is None:
        status = next((_TYPE_STATUS[n] for n in names if n in _TYPE_STATUS), None)
    if status is None and any(n.startswith("invalid_") for n in names):  # Responses' invalid_prompt, invalid_image...
        status = 400
    overload = status in OVERLOAD_STATUSES or any(n in OVERLOAD_TYPES for n in names)
    code = raw_code if raw_code is not None else type_
    return StreamFailure(
        kind=kind,
        message=message[:_MESSAGE_LIMIT],
        status=status,
        code=None if code is None else str(code),
        overload=overload,
        retry_after=_seconds(fields.get("retry_after")),
        body=json.dumps({**(envelope or {}), "error": _whole(error, message, type_)}, default=str).encode(),
    )


def _whole(error: object, message: str, type_: object) -> dict[str, object]:
    """The error object of the JSON body handed back: the server's own, every key it sent (``metadata`` and
    the like included), with a ``message`` added if it had none; a plain string error becomes
    ``{"message": ..., "type": ...}`` (its sibling type field)."""
    if isinstance(error, dict):
        return error if "message" in error else {"message": message, **error}
    return {"message": message} if type_ is None else {"message": message, "type": type_}


def malformed(what: str, data: bytes) -> StreamFailure:
    """A failure for an event or body that is not the protocol's JSON; ``data`` is quoted, shortened."""
    sample = data[:80].decode("utf-8", "replace")
    return StreamFailure("malformed", f"{what} is not valid JSON of its protocol: {sample!r}")
