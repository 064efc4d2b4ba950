"""Which headers a client's signature covers, and whether it signs the URL."""

from __future__ import annotations

from llmguard_client._http.signed import Signed, signature_of

SIGV4 = (
    b"AWS4-HMAC-SHA256 Credential=AKID/20261207/us-east-1/bedrock/aws4_request, "
    b"SignedHeaders=content-type;host;X-Amz-Date;x-llmguard-tier;x-stainless-retry-count, Signature=abc"
)


def test_sigv4_in_the_authorization_header_signs_its_headers_and_the_url() -> None:
    signed = signature_of(SIGV4, None, b"")
    assert signed == Signed(
        frozenset({b"authorization", b"content-type", b"x-amz-date", b"x-llmguard-tier", b"x-stainless-retry-count"}),
        url=True,
    )


def test_a_presigned_url_signs_the_headers_its_query_names() -> None:
    query = b"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-SignedHeaders=host%3Bx-llmguard-tier&X-Amz-Signature=abc"
    assert signature_of(None, None, query) == Signed(frozenset({b"x-llmguard-tier"}), url=True)


def test_http_message_signatures_cover_what_signature_input_lists() -> None:
    covered = b'sig1=("@method" "@authority" "content-digest" "x-llmguard-tier");created=1;keyid="k"'
    signed = signature_of(None, covered, b"")
    assert signed == Signed(frozenset({b"content-digest", b"x-llmguard-tier", b"signature", b"signature-input"}), True)
    headers_only = signature_of(None, b'sig1=("@method" "content-digest");created=1', b"")
    assert headers_only is not None and not headers_only.url


def test_a_bearer_token_or_a_plain_query_signs_nothing() -> None:
    assert signature_of(b"Bearer sk-abc", None, b"api-version=2024-10-21") is None
    assert signature_of(None, None, b"") is None
