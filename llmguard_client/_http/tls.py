"""The default TLS context, shared by every HTTP client the package builds while the environment names the same CAs."""

from __future__ import annotations

import functools
import os
import ssl

import httpx

__all__ = ["default_tls_context"]

_CA_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR")
"""What httpx reads from the environment to choose the CAs of a client left to its default ``verify``."""


def default_tls_context() -> ssl.SSLContext:
    """The default verifying TLS context, with the CAs a client built now would trust: the CA bundle, or
    ``SSL_CERT_FILE``/``SSL_CERT_DIR`` as httpx reads them. One context per value of those variables: building
    one loads the CA bundle, ~40 ms of CPU here and 0.3-1.7 s on a busy 2-core machine, and an
    ``httpx.AsyncClient`` left to its default builds one each."""
    return _context_for(tuple(os.environ.get(name) or None for name in _CA_VARIABLES))


@functools.cache
def _context_for(environment: tuple[str | None, ...]) -> ssl.SSLContext:
    """httpx's own default context, built for ``environment`` (the values of `_CA_VARIABLES` it reads)."""
    del environment  # the cache key: httpx reads the same variables itself
    return httpx.create_ssl_context()
