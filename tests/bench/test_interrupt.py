"""Ctrl-C stops ``llmguard demo`` and ``llmguard bench --processes``: at once, one line, no child left."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from llmguard_tools.bench import interrupt

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 2.0
"""Seconds from the SIGINT to the command's exit."""


def group_members(pgid: int) -> list[str]:
    """The processes of group ``pgid`` (zombies included), as ``ps`` lists them."""
    out = subprocess.run(["ps", "-A", "-o", "pgid=,pid=,stat=,args="], capture_output=True, text=True, check=True)
    return [line.strip() for line in out.stdout.splitlines() if line.split() and line.split()[0] == str(pgid)]


def start(args: list[str], members: int) -> subprocess.Popen[str]:
    """``llmguard ARGS`` in a session (and process group) of its own, once its group has ``members`` processes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmguard_tools.cli", *args, "--no-progress"],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    # the simulated cluster / the workers are up: Python processes only (an import may run a short-lived
    # `ldconfig` in the group, which once counted as the cluster, so the SIGINT came while the command was
    # still importing, before it had taken SIGINT over)
    while len([m for m in group_members(proc.pid) if "python" in m]) < members:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, group_members(proc.pid)
        time.sleep(0.05)
    time.sleep(0.5)  # and calls are on their way
    return proc


def interrupt_and_check(proc: subprocess.Popen[str], *, whole_group: bool) -> None:
    pgid = proc.pid
    sent = time.monotonic()
    if whole_group:
        os.killpg(pgid, signal.SIGINT)  # what a terminal's Ctrl-C does
    else:
        os.kill(proc.pid, signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(pgid, signal.SIGKILL)
            proc.communicate()
    took = time.monotonic() - sent
    assert took < LIMIT, f"exited {took:.2f} s after the SIGINT"
    assert proc.returncode == interrupt.EXIT_STATUS, stderr[-3000:]
    assert stderr.splitlines() == ["llmguard: error: interrupted"]
    assert running(group_members(pgid)) == []


def running(members: list[str]) -> list[str]:
    """``members`` less zombies: a process that already exited and waits for its reaper runs nothing. A worker
    killed while a child of its own (e.g. ``ldconfig``, which ``ctypes.util.find_library`` runs) was ending
    leaves that child to init, which reaps it when it gets to it."""
    return [line for line in members if not line.split()[2].startswith("Z")]


@pytest.mark.parametrize("whole_group", [True, False], ids=["group", "process"])
def test_ctrl_c_stops_the_demo_and_its_cluster(whole_group: bool) -> None:
    interrupt_and_check(start(["demo"], members=2), whole_group=whole_group)


@pytest.mark.parametrize("whole_group", [True, False], ids=["group", "process"])
def test_ctrl_c_stops_bench_processes_and_its_workers(whole_group: bool) -> None:
    proc = start(["bench", "--sim", "ratelimited", "--processes", "2"], members=3)
    interrupt_and_check(proc, whole_group=whole_group)


# --- run_interruptibly in this process (children left alone: the test process's own are not ours to stop) --


@pytest.fixture
def stopped(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(interrupt, "stop_children", lambda timeout=0.5: calls.append("stopped"))
    return calls


def test_a_command_that_absorbs_the_interrupt_still_ends_interrupted(stopped: list[str]) -> None:
    said: list[str] = []
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the run was started in the background by a script
    filters, stderr = list(warnings.filters), sys.stderr

    def command() -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here
        except KeyboardInterrupt:
            pass  # as a task that swallows its cancellation would
        return 0

    assert interrupt.run_interruptibly(command, lambda line, stream: said.append(line)) == interrupt.EXIT_STATUS
    assert said == ["interrupted"]
    assert stopped == ["stopped"]
    assert signal.getsignal(signal.SIGINT) is before
    # what the interrupt silenced on the way out is loud again for whatever runs next in the process
    assert list(warnings.filters) == filters and sys.stderr is stderr and logging.root.manager.disable == 0


def test_without_an_interrupt_the_command_runs_as_it_is(stopped: list[str]) -> None:
    said: list[str] = []
    assert interrupt.run_interruptibly(lambda: 3, lambda line, stream: said.append(line)) == 3
    with pytest.raises(ValueError, match="boom"):
        interrupt.run_interruptibly(lambda: int("boom"), lambda line, stream: said.append(line))
    assert said == [] and stopped == []


def test_an_interrupt_inside_a_string_exec_still_exits_with_130_under_python_m(tmp_path: Path) -> None:
    """CPython (3.11-3.12 at least) marks the interpreter to die by SIGINT at exit, under ``python -m``, when a
    string ``exec`` ends with KeyboardInterrupt, even one caught later: dataclasses and namedtuple build their
    methods so, and a Ctrl-C during an import that creates one made ``llmguard demo`` end with -2, not 130."""
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import sys\n"
        "from llmguard_tools.bench.interrupt import run_interruptibly\n"
        "CODE = 'import os, signal, time\\nos.kill(os.getpid(), signal.SIGINT)\\ntime.sleep(5)'\n"
        "sys.exit(run_interruptibly(lambda: exec(CODE, {}), lambda line, stream: print(line, file=stream)))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "interrupted_in_exec"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        start_new_session=True,  # its SIGINT reaches no one else
    )
    assert (done.returncode, done.stderr) == (interrupt.EXIT_STATUS, "interrupted\n")
