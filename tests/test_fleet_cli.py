"""``llmguard-rollout get|set|kill|clear --fleet URL --name NAME`` (the runtime's command) reaches 4 running
processes; the tools' ``llmguard rollout`` is the same command."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

import pytest
import redis

from llmguard_client import Guard, GuardConfigError
from llmguard_client.fleet_cli import check_fleet_url, main
from llmguard_tools import cli
from tests.redis_server import RedisServer

POLL = 0.5


class Process:
    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fleet.fleet_process", "rollout", url, "checkout", str(POLL)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def read_until(self, expected: str, seconds: float = 60.0) -> None:
        """Read lines until one is ``expected`` (a generous bound: a busy machine starts Python slowly)."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                if self.lines.get(timeout=max(0.0, deadline - time.monotonic())) == expected:
                    return
            except queue.Empty:
                raise AssertionError(f"the process never printed {expected!r}") from None

    def stop(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()


def test_set_and_kill_reach_four_running_processes(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    processes = [Process(redis_server.url) for _ in range(4)]
    try:
        for p in processes:
            p.read_until("ready")
        assert main(["set", "0.10", "--fleet", redis_server.url, "--name", "checkout"]) == 0
        for p in processes:
            p.read_until("fraction 0.1")
        assert main(["get", "--fleet", redis_server.url, "--name", "checkout"]) == 0
        assert "0.1 of calls guarded on every process" in capsys.readouterr().out
        assert main(["kill", "--fleet", redis_server.url, "--name", "checkout"]) == 0
        for p in processes:
            p.read_until("fraction 0.0")
        assert "kill switch ON" in capsys.readouterr().out
        assert main(["set", "0.5", "--fleet", redis_server.url, "--name", "checkout"]) == 0
        for p in processes:
            p.read_until("fraction 0.5")
    finally:
        for p in processes:
            p.stop()


def _tools_rollout(argv: Sequence[str]) -> int:
    return cli.main(["rollout", *argv])


COMMANDS = pytest.mark.parametrize("command", [main, _tools_rollout], ids=["llmguard-rollout", "llmguard rollout"])


@COMMANDS
def test_a_bad_fleet_url_is_a_usage_error(
    command: Callable[[Sequence[str]], int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert command(["get", "--fleet", "http://:secret@host", "--name", "checkout"]) == 2
    err = capsys.readouterr().err
    assert "scheme 'http'" in err and "secret" not in err


@COMMANDS
def test_an_unreachable_fleet_exits_1_without_its_password(
    command: Callable[[Sequence[str]], int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert command(["kill", "--fleet", "redis://:secret@127.0.0.1:1/0", "--name", "checkout"]) == 1
    err = capsys.readouterr().err
    assert "did not answer" in err and "secret" not in err and err.count("\n") == 1


@COMMANDS
@pytest.mark.parametrize("action", ["kill", "get", "clear"])
def test_a_fraction_given_to_another_command_than_set_is_named_as_such(
    command: Callable[[Sequence[str]], int], action: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rollout kill 0.3`` answered "rollout set needs a FRACTION", naming a command that was not given."""
    assert command([action, "0.3", "--fleet", "redis://127.0.0.1:1/0", "--name", "checkout"]) == 2
    err = capsys.readouterr().err
    assert f"rollout {action} takes no FRACTION, got 0.3; only set does" in err and err.count("\n") == 1


def test_run_as_a_module_it_is_the_same_command() -> None:
    """``python -m llmguard_client.fleet_cli``: the module's entry point runs once the module is whole."""
    done = subprocess.run(
        [sys.executable, "-m", "llmguard_client.fleet_cli", "set", "--fleet", "redis://127.0.0.1:1/0", "--name", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "needs a FRACTION" in done.stderr


def _user(server: RedisServer, name: str, *rules: str) -> str:
    """An ACL user of ``server`` with every permission less ``rules``; its URL."""
    admin = redis.Redis(port=server.port)
    try:
        admin.acl_setuser(name, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], commands=["+@all", *rules])
    finally:
        admin.close()
    return f"redis://{name}:pw@127.0.0.1:{server.port}/0"


@COMMANDS
def test_a_value_stored_but_not_announced_is_reported_as_stored(
    command: Callable[[Sequence[str]], int], redis_factory: type[RedisServer], capsys: pytest.CaptureFixture[str]
) -> None:
    """A user that may not PUBLISH: the value is stored, so the command succeeds and says the processes follow at
    their next read instead of at once, and why."""
    server = redis_factory()
    server.start()
    url = _user(server, "ops", "-publish")
    assert command(["set", "0.5", "--fleet", url, "--name", "checkout"]) == 0
    out, err = capsys.readouterr()
    assert "0.5 of calls guarded on every process" in out
    assert err.count("\n") == 1 and "did not answer" not in err and ":pw@" not in err
    assert ": warning: stored" in err and "was refused (NoPermissionError" in err and "'publish'" in err
    assert "within their rollout_poll_interval (5 s by default)" in err
    assert main(["get", "--fleet", server.url, "--name", "checkout"]) == 0  # and it is there for everyone
    assert "0.5 of calls guarded" in capsys.readouterr().out


@COMMANDS
def test_a_refused_command_exits_1_naming_the_refusal(
    command: Callable[[Sequence[str]], int], redis_factory: type[RedisServer], capsys: pytest.CaptureFixture[str]
) -> None:
    """A store that answered with a refusal (no permission to SET) did answer: the error says what it refused."""
    server = redis_factory()
    server.start()
    url = _user(server, "reader", "-set")
    assert command(["kill", "--fleet", url, "--name", "checkout"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused the command: NoPermissionError" in err and "'set'" in err, err
    assert "did not answer" not in err and ":pw@" not in err


@pytest.mark.parametrize("bad", ["http://x", "redis://h:99999", "redis://h/abc"])
def test_check_fleet_url_is_the_guards_check(bad: str) -> None:
    """What a tool checks a ``--fleet`` argument with before it sends anything: the address as given, or the
    `GuardConfigError` the Guard raises for it."""
    assert check_fleet_url("redis://:pw@host:6379/0") == "redis://:pw@host:6379/0"
    with pytest.raises(GuardConfigError) as refused:
        check_fleet_url(bad)
    with pytest.raises(GuardConfigError) as guards:
        Guard(["http://127.0.0.1:9"], fleet=bad, name="x")
    assert str(refused.value) == str(guards.value)
