"""The real vLLM engine some tests run against: ``LLMGUARD_VLLM_URL`` (its base URL, e.g.
``http://127.0.0.1:8011``; ``/work/shared/tools/vllm/setup.sh serve`` starts one); without a healthy one they skip."""

from __future__ import annotations

import os

import httpx
import pytest

URL = os.environ.get("LLMGUARD_VLLM_URL", "").rstrip("/")


def _healthy() -> bool:
    if not URL:
        return False
    try:
        return httpx.get(URL + "/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


NEEDS_VLLM = pytest.mark.skipif(not _healthy(), reason="no vLLM server (set LLMGUARD_VLLM_URL; see the docstring)")
"""``pytestmark = NEEDS_VLLM``: the module's tests skip without a healthy engine."""
