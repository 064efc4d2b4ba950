"""How xdist deals the tests to its workers (``--dist load``, tests/conftest.py): longest first, then one at a time.

xdist's own ``load`` sends each worker a run of consecutive tests, a quarter of its share at first: the long tests,
wherever they stand in the order, went to whichever worker drew their run, often several to one worker and one
of them last, the other workers idle meanwhile. Here the longest tests (`LONGEST_FIRST`) come first and each test
goes to the first worker that is free (with two or three queued ahead), so they spread over the workers and the
short ones fill in around them.

`SAME_WORKER` keeps a few modules on one worker, for what only they pay: importing anthropic (~1.7 s of CPU), the
shared Redis Cluster and the TLS certificates. (xdist's ``xdist_group`` marker does this for ``--dist loadgroup``,
but its workers rename the tests to do it, and pytest 9 no longer lets them.)
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

LONGEST_FIRST = (
    "tests/test_docs.py::test_the_docs_show_what_their_commands_print[docs/rollout.md]",  # 19 s
    "tests/loadtest/test_locust.py::test_a_master_and_two_workers_report_both_classes_and_close_the_guard",  # 12 s
    "tests/stream/test_watchdog.py::test_gaps_shorter_than_the_stall_never_cut_a_long_stream",  # 6.5 s
    "tests/test_docs.py::test_the_docs_show_what_their_commands_print",  # 4-5.5 s each
    "tests/fleet/test_sharing.py",  # 5 s
    "tests/fleet/test_cluster_node_loss.py",  # 2-4 s each
    "tests/edges/test_cooperative.py::test_the_calls_deadline_holds_across_the_sdks_requests",
    "tests/routing/affinity/test_affinity_loopback.py::test_a_hot_key_spills_within_the_load_bound",
    "tests/test_fleet_cli.py::test_set_and_kill_reach_four_running_processes",
    "tests/test_cli.py::test_demo_runs_both_scenarios",
    "tests/test_cli.py::test_a_run_behind_plan_is_invalid_and_gets_no_verdict",
    "tests/routing/test_panic.py::test_two_failing_calls_do_not_stop_the_guard_from_sending_to_its_only_replica",
    "tests/routing/test_cooldown.py::test_one_replica_after_a_retry_after_120_a_500_is_not_relabelled",
    "tests/bench/test_fleet_worker.py::test_every_call_is_completed_or_failed_with_its_cause",
    "tests/protocols/test_sdk_streams.py",  # 1.8-2.6 s each
    "tests/chaos/test_policy.py::test_one_seed_gives_the_same_faults_and_each_rate_is_kept",
    "tests/bench/test_runner.py::test_open_loop_follows_the_planned_arrivals",
    "tests/fleet/test_guard_fleet.py",
    "tests/test_cli.py::test_bench_writes_json_and_plot",
    "tests/sim/test_http_faults.py::test_a_rate_limited_window_answers_429_with_a_long_retry_after",
    "tests/budget/test_budget.py::test_invariant_against_exact_log",
    "tests/test_stress.py",  # 1.5-2 s each
)
"""Node id prefixes of the longest tests (about 2 s and up on a quiet 2-core machine), longest first."""

SAME_WORKER = {
    "tests/edges/test_sdk_defaults.py": "anthropic",
    "tests/fleet/test_cluster.py": "redis-cluster-tls",
    "tests/fleet/test_tls.py": "redis-cluster-tls",
}
"""Modules whose tests run on one worker, by the name of what they share (xdist sends each name's tests together,
ahead of the single tests)."""


def rank(nodeid: str) -> int:
    """The test's place among `LONGEST_FIRST` (``len(LONGEST_FIRST)`` for every other test)."""
    return next((i for i, prefix in enumerate(LONGEST_FIRST) if nodeid.startswith(prefix)), len(LONGEST_FIRST))


def unit(nodeid: str) -> str:
    """What xdist deals as one: the test alone, or its module's `SAME_WORKER` name."""
    return SAME_WORKER.get(nodeid.split("::", 1)[0], nodeid)


class OneAtATime(LoadScopeScheduling):
    """``--dist load`` with each test a unit of its own (but for `SAME_WORKER`), dealt in collection order to the
    first worker with at most two tests queued."""

    def _split_scope(self, nodeid: str) -> str:
        return unit(nodeid)
