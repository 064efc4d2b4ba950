"""How xdist deals the tests to its workers (``--dist load``, tests/conftest.py): longest first, then one at a time.

xdist's own ``load`` sends each worker a run of consecutive tests, a quarter of its share at first: the long tests,
wherever they stand in the order, went to whichever worker drew their run, often several to one worker and one
of them last, the other workers idle meanwhile. Here the longest tests (`LONGEST_FIRST`) come first and each test
goes to the first worker that is free (with two or three queued ahead), so they spread over the workers and the
short ones fill in around them. Among the longest, those that keep the cores busy alternate with those that mostly
wait, so that they do not all compete for the two cores at once.

`SAME_WORKER` keeps a few modules on one worker, for what only they pay: importing anthropic (~1.7 s of CPU), the
shared Redis Cluster and the TLS certificates, a module-scoped fixture. (xdist's ``xdist_group`` marker does this
for ``--dist loadgroup``, but its workers rename the tests to do it, and pytest 9 no longer lets them.)
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

LONGEST_FIRST = (
    # (B) busy: keeps a core or more busy, its own processes included; (W) waits: on deadlines, stalls, backoffs
    "tests/test_docs.py::test_the_docs_show_what_their_commands_print[docs/rollout.md]",  # B 14-19 s
    "tests/stream/test_watchdog.py::test_gaps_shorter_than_the_stall_never_cut_a_long_stream",  # W 6.5 s
    "tests/loadtest/test_locust.py::test_a_master_and_two_workers_report_both_classes_and_close_the_guard",  # B 12 s
    "tests/fleet/test_cluster_node_loss.py",  # W 2-4 s each
    "tests/fleet/test_sharing.py",  # B 5 s
    "tests/edges/test_cooperative.py::test_the_calls_deadline_holds_across_the_sdks_requests",  # W 3.6 s
    "tests/test_docs.py::test_the_docs_show_what_their_commands_print",  # B 2-5.5 s each
    "tests/routing/affinity/test_affinity_loopback.py::test_a_hot_key_spills_within_the_load_bound",  # W 3.5 s
    "tests/test_fleet_cli.py::test_set_and_kill_reach_four_running_processes",  # B 3.4 s
    "tests/routing/test_panic.py::test_two_failing_calls_do_not_stop_the_guard_from_sending_to_its_only_replica",  # W
    "tests/test_cli.py::test_demo_runs_both_scenarios",  # B 3 s
    "tests/routing/test_cooldown.py::test_one_replica_after_a_retry_after_120_a_500_is_not_relabelled",  # W 2.7 s
    "tests/bench/test_interrupt.py::test_ctrl_c_stops",  # B 1 s each
    "tests/test_cli.py::test_a_run_behind_plan_is_invalid_and_gets_no_verdict",  # W 2.8 s
    "tests/bench/test_shards.py",  # B
    "tests/bench/test_fleet_worker.py::test_every_call_is_completed_or_failed_with_its_cause",  # W 2.6 s
    "tests/test_cli.py::test_bench_writes_json_and_plot",  # B
    "tests/protocols/test_sdk_streams.py",  # W 1.8-2.6 s each
)
"""Node id prefixes of the longest tests (about 2 s and up on a quiet 2-core machine), longest first, the busy
ones alternating with the ones that mostly wait: all the busy ones at once left each of them waiting for a core
(the rollout guide's commands took 30 s instead of 14-19) while the cores idled later on."""

SAME_WORKER = {
    "tests/edges/test_sdk_defaults.py": "anthropic",
    "tests/fleet/test_cluster.py": "redis-cluster-tls",
    "tests/fleet/test_tls.py": "redis-cluster-tls",
    "tests/sim/test_engine_seed.py": "engine-spike",
}
"""Modules whose tests run on one worker, by the name of what they share (xdist sends each name's tests together,
ahead of the single tests): importing anthropic, the Redis Cluster and the TLS certificates, a module-scoped
fixture (0.7-0.9 s of CPU, once per worker that runs one of its tests)."""


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
