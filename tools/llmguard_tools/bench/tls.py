"""One verifying TLS context for every HTTP client the tools build (building one loads the CA bundle)."""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["tls_context"]


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context (its CA bundle, ``SSL_CERT_FILE``/``SSL_CERT_DIR``), built once."""
    return httpx.create_ssl_context()
