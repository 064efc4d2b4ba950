"""`Admission` checks its fields when built: a bad value is a GuardConfigError naming the field, the value and
what is accepted."""

from __future__ import annotations

from typing import Any

import pytest

from llmguard_client import Admission, GuardConfigError


@pytest.mark.parametrize("field", ["initial_limit", "min_limit", "max_limit", "max_waiting", "max_server_queue"])
@pytest.mark.parametrize("value", [1.5, 4.0, "4"], ids=["fraction", "float", "str"])
def test_the_counts_are_integers(field: str, value: Any) -> None:
    """A limit of 1.5 calls was taken while ``initial_limit=True`` was refused: each count is an integer."""
    with pytest.raises(GuardConfigError) as info:
        Admission(**{field: value})
    message = str(info.value)
    assert f"Admission: {field} must be an integer >=" in message and repr(value) in message


@pytest.mark.parametrize("field", ["by_size", "send_slo", "ask_load_reports"])
@pytest.mark.parametrize("value", ["yes", "no", 1, None], ids=["yes", "no", "int", "none"])
def test_the_switches_are_bools(field: str, value: Any) -> None:
    """``by_size="no"`` was truthy, so it behaved as on: each switch is True or False."""
    with pytest.raises(GuardConfigError) as info:
        Admission(**{field: value})
    assert str(info.value) == f"Admission: {field} must be True or False, got {value!r}"


def test_integer_counts_and_bool_switches_are_accepted() -> None:
    policy = Admission(initial_limit=4, min_limit=2, max_limit=8, max_waiting=0, max_server_queue=0, by_size=False)
    assert (policy.initial_limit, policy.by_size) == (4, False)
