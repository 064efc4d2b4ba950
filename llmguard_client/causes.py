"""`guard_failure(exc)`: did the guard decide this failure, and why?

One question, whatever raised: an `llmguard_client` exception (raise mode), an httpx or
httpx2 exception the edges translated, or an SDK's own error (openai, anthropic). The
answer is the guard's machine-readable cause (``"ttft_timeout"``, ``"bulkhead_full"``,
``"budget_exhausted"``...; ``"upstream_status"`` when the guard stopped retrying a server's error
answer and handed it back), or None when the guard had no hand in it (an answer it does not retry, such as
a 400 or a 409, is the server's and the SDK's, as without a guard).

Where it looks, in order, on the exception and then on its ``__cause__`` / ``__context__``
chain (and the members of an exception group): a `GuardFailure`'s ``.cause``; then the
``x-llmguard-cause`` header of an attached ``.response`` (openai's and anthropic's
``APIStatusError``, httpx's ``HTTPStatusError``): in response mode the guard answers with
a proxy-style error response that carries it.
"""

from __future__ import annotations

from llmguard_client._core.headers import CAUSE_HEADER
from llmguard_client.errors import GuardFailure


def guard_failure(exc: BaseException) -> str | None:
    """The guard's cause for ``exc`` (e.g. ``"ttft_timeout"``), or None if the guard did not decide it.

    >>> try:
    ...     await client.chat.completions.create(...)
    ... except openai.APIError as exc:
    ...     if guard_failure(exc) == "ttft_timeout": ...
    """
    if not isinstance(exc, BaseException):
        raise TypeError(f"guard_failure() takes an exception, got {type(exc).__name__}: {exc!r}")
    seen: set[int] = set()
    queue: list[BaseException] = [exc]
    while queue:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, GuardFailure):
            return current.cause
        cause = _header_cause(current)
        if cause is not None:
            return cause
        members = getattr(current, "exceptions", None)  # an exception group
        if isinstance(members, (tuple, list)):
            queue.extend(m for m in members if isinstance(m, BaseException))
        queue.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


def _header_cause(exc: BaseException) -> str | None:
    """The guard's cause header on the answer ``exc`` was raised for: its ``response`` (openai, anthropic, httpx,
    huggingface_hub), its ``raw_response`` (mistralai) or its own ``headers`` (cohere)."""
    for holder in ("response", "raw_response", None):
        try:
            source = exc if holder is None else getattr(exc, holder, None)
            headers = getattr(source, "headers", None) if source is not None else None
            value = headers.get(CAUSE_HEADER) if headers is not None else None
        except Exception:  # some exceptions raise from a property when no response is attached
            continue
        if isinstance(value, str) and value:
            return value
    return None
