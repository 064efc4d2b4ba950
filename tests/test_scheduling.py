"""The order and units xdist deals the tests in (tests/scheduling.py) name tests that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scheduling import LONGEST_FIRST, SAME_WORKER, rank, unit

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("prefix", LONGEST_FIRST)
def test_each_of_the_longest_names_a_test_module_and_function(prefix: str) -> None:
    path, _, name = prefix.partition("::")
    source = (ROOT / path).read_text(encoding="utf-8")
    assert not name or f"def {name.split('[')[0]}" in source, f"{prefix} names no test (renamed?)"


@pytest.mark.parametrize("module", sorted(SAME_WORKER))
def test_each_module_kept_on_one_worker_exists(module: str) -> None:
    assert (ROOT / module).is_file()


def test_the_longest_come_first_in_their_order_and_the_rest_after() -> None:
    docs = "tests/test_docs.py::test_the_docs_show_what_their_commands_print"
    assert rank(f"{docs}[docs/rollout.md]") == 0 < rank(f"{docs}[README.md]") < rank("tests/test_stress.py::t")
    assert rank("tests/core/test_request.py::test_x") == len(LONGEST_FIRST)


def test_a_test_is_dealt_alone_unless_its_module_shares_a_worker() -> None:
    assert unit("tests/core/test_request.py::test_x[1]") == "tests/core/test_request.py::test_x[1]"
    assert unit("tests/fleet/test_cluster.py::test_a") == unit("tests/fleet/test_tls.py::test_b")
    assert unit("tests/edges/test_sdk_defaults.py::test_a") != unit("tests/fleet/test_tls.py::test_b")
