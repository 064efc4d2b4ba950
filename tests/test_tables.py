"""The one table layout of the tools (llmguard_tools.tables): bench's and compare's tables split the same way."""

from __future__ import annotations

from llmguard_tools.tables import fit_columns, text_tables


def test_columns_go_into_the_fewest_groups_that_fit_in_order() -> None:
    widths = {"a": 3, "b": 4, "c": 5, "d": 9, "e": 1}
    groups = fit_columns(list(widths), lambda group: sum(widths[c] for c in group) <= 9)
    assert groups == [["a", "b"], ["c"], ["d"], ["e"]]


def test_a_column_wider_than_the_limit_still_gets_a_group_of_its_own() -> None:
    assert fit_columns(["wide", "x"], lambda group: len(group) == 1 and group[0] == "x") == [["wide"], ["x"]]


def test_text_tables_repeat_the_key_columns_and_fit_the_width() -> None:
    rows = [["tier", "cohort", "success", "TTFT p99"], ["chat", "guarded", "99.00%", "0.120 s"]]
    wide = text_tables(rows, 2, 80)
    assert wide == ["tier  cohort   success  TTFT p99", "chat  guarded   99.00%   0.120 s"]
    narrow = text_tables(rows, 2, 25)
    assert narrow == [
        "tier  cohort   success",
        "chat  guarded   99.00%",
        "",
        "tier  cohort   TTFT p99",
        "chat  guarded   0.120 s",
    ]
    assert max(len(line) for line in narrow) <= 25
