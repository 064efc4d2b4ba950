"""Whose rate limit a call draws on: a short hash of its key and account headers, never the key (every caller's for
a signed request); a cool-down held for one scope or several holds for their calls, and for everyone outside a call."""

from __future__ import annotations

import httpx

from llmguard_client._routing.caller import calling_as, holds_for_caller, limit_scope, scopes, united


def test_one_key_sent_as_api_key_and_as_a_bearer_token_is_one_scope() -> None:
    both = httpx.Headers({"api-key": "sk-one", "authorization": "Bearer sk-one"})
    assert limit_scope(both, False) == limit_scope(httpx.Headers({"authorization": "Bearer sk-one"}), False)
    assert limit_scope(both, False) == limit_scope(httpx.Headers({"x-api-key": "sk-one"}), False)


def test_another_key_organisation_or_project_is_another_scope() -> None:
    key = {"authorization": "Bearer sk-one"}
    scopes = {
        limit_scope(httpx.Headers(key), False),
        limit_scope(httpx.Headers({"authorization": "Bearer sk-two"}), False),
        limit_scope(httpx.Headers({**key, "openai-organization": "org-a"}), False),
        limit_scope(httpx.Headers({**key, "openai-organization": "org-b"}), False),
        limit_scope(httpx.Headers({**key, "openai-project": "proj-a"}), False),
    }
    assert len(scopes) == 5


def test_the_scope_holds_no_part_of_the_key_and_a_request_without_one_has_none() -> None:
    scope = limit_scope(httpx.Headers({"authorization": "Bearer sk-secret-0123456789"}), False)
    assert scope is not None and len(scope) == 16 and "secret" not in scope and "0123" not in scope
    assert limit_scope(httpx.Headers({"content-type": "application/json"}), False) == ""


def test_a_signed_request_is_every_callers_its_signature_being_new_on_each_request() -> None:
    sigv4 = "AWS4-HMAC-SHA256 Credential=AKID/20261207/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=a1"
    assert limit_scope(httpx.Headers({"authorization": sigv4}), True) is None


def test_a_cool_down_held_for_a_scope_holds_for_its_calls_and_outside_any_call() -> None:
    assert holds_for_caller("a") and holds_for_caller(None)
    with calling_as("a"):
        assert holds_for_caller("a") and holds_for_caller(None)
    with calling_as("b"):
        assert not holds_for_caller("a") and holds_for_caller(None)
        with calling_as(None):
            assert holds_for_caller("a")
        assert not holds_for_caller("a")


def test_a_cool_down_held_for_several_keys_holds_for_each_of_their_calls_and_no_other() -> None:
    both = united(united("b", "a"), "a")
    assert both == "a,b" and scopes(both) == ["a", "b"]
    for scope, held in (("a", True), ("b", True), ("c", False), ("a,b", True)):
        with calling_as(scope):
            assert holds_for_caller(both) is held
    keyless = united("", "a")  # a request without a key is a scope of its own, "", joined as any other
    with calling_as(""):
        assert holds_for_caller(keyless)
    with calling_as("b"):
        assert not holds_for_caller(keyless)
