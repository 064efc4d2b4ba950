"""The SDKs' own client test suites, run plain and through a Guard: a regression suite for faithfulness.

    python scripts/peer_suites.py [--suite openai ...] [--workdir /tmp/llmguard-peer] [--check]
                                  [--retry-mode guard|cooperative] [--budget-floor N]

For each pinned SDK release it downloads the sdist from the package index (``pip download --no-deps
--no-binary :all:``), unpacks its ``tests/``, installs the SDK and what its tests import into a throwaway
venv of its own (with this checkout, editable), and runs the suite's ``tests/test_client.py`` twice, in the unpacked
directory so the suite's own pytest settings apply (warnings are errors there): plain, and with
``scripts/peer_plugin.py``, which sends every client the SDK builds through a fresh Guard per test. It prints
both pass counts and each test that passes plain and fails guarded.

``--check``: exit 1 if a test passes plain and fails guarded without being named in docs/compatibility.md
(each difference is listed there with its reason). About 5 minutes for the three suites on a busy 2-core
machine, +3 min to build their venvs the first time; ``tests/test_peer_suites.py`` runs it under ``-m peer``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = {"openai": "openai==3.63.0", "anthropic": "anthropic==2.17.0", "anthropic-httpx": "anthropic==0.121.0"}
"""The SDK releases whose suites run (served by PyPI as sdists with their tests): the newest openai and
anthropic (over httpx2; anthropic's suite makes ``import httpx`` resolve to httpx2 for the whole run), and
the last anthropic over httpx (the guard's httpx edge, as openai 1.x/2.x and anthropic < 1 use it)."""
TEST_DEPS = [
    "pytest>=8",
    "pytest-asyncio>=1",
    "pytest-xdist>=3.6",
    "respx>=0.22",
    "time-machine",
    "dirty-equals>=0.6",
    "rich>=13.7",
    "inline-snapshot>=0.28",
    "http-snapshot[httpx]==0.1.9",
]
"""What the suites' test_client.py, conftest.py and utils.py import (their dev dependency groups)."""
KNOWN = ROOT / "docs" / "compatibility.md"


def quiet(cmd: list[str]) -> None:
    """Run ``cmd``; its output is shown only if it fails."""
    done = subprocess.run(cmd, text=True, capture_output=True, check=False)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


@contextlib.contextmanager
def locked(workdir: Path) -> Iterator[None]:
    """The workdir to this run alone while it builds venvs and unpacks suites (two runs at once, e.g. the two
    tests of tests/test_peer_suites.py under xdist, share them)."""
    with open(workdir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def venv(workdir: Path, suite: str, python: str) -> Path:
    """The suite's throwaway venv: its pinned SDK, the suites' test dependencies and this checkout."""
    env = workdir / f"venv-{suite}"
    stamp = env / "peer-stamp.json"
    want = json.dumps({"sdk": SUITES[suite], "deps": TEST_DEPS, "root": str(ROOT)})
    if stamp.exists() and stamp.read_text() == want:
        return env
    subprocess.run([python, "-m", "venv", "--clear", str(env)], check=True)
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q"]
    quiet([*pip, SUITES[suite], *TEST_DEPS, "-e", f"{ROOT}[httpx2]"])
    stamp.write_text(want)
    return env


def unpack(workdir: Path, pin: str, env: Path) -> Path:
    """The SDK's sdist unpacked under ``workdir`` (downloaded once)."""
    name, version = pin.split("==")
    target = workdir / f"{name}-{version}"
    if (target / "tests" / "test_client.py").exists():
        return target
    pip = [str(env / "bin" / "python"), "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
    quiet([*pip, pin, "-d", str(workdir)])
    with tarfile.open(workdir / f"{name}-{version}.tar.gz") as archive:
        archive.extractall(workdir, filter="data")
    return target


def outcomes(
    env: Path, source: Path, guarded: bool, mode: str = "guard", budget_floor: int | None = None
) -> dict[str, str]:
    """Each test's outcome (passed, failed, skipped) in one run of the suite's tests/test_client.py."""
    with tempfile.TemporaryDirectory(prefix="peer-") as reports:  # this run's own: runs at once share the source
        report = Path(reports) / "report.xml"
        cmd = [str(env / "bin" / "python"), "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
        cmd += [f"--junitxml={report}", "-o", "junit_family=xunit1", "tests/test_client.py"]
        env_vars = None
        if guarded:
            cmd[-1:-1] = ["-p", "peer_plugin"]
            env_vars = {"PYTHONPATH": str(ROOT / "scripts"), "PEER_RETRY_MODE": mode}
            if budget_floor is not None:
                env_vars["PEER_BUDGET_FLOOR"] = str(budget_floor)
        environ = {**os.environ, **(env_vars or {})}
        done = subprocess.run(cmd, cwd=source, text=True, capture_output=True, env=environ)
        if not report.exists():
            sys.exit(f"pytest produced no report in {source}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        cases = list(ET.parse(report).getroot().iter("testcase"))
    results: dict[str, str] = {}
    for case in cases:
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        if results.get(test) != "failed":  # an error at teardown fails a test that passed
            results[test] = outcome
    return results


def known_differences() -> set[str]:
    """The tests docs/compatibility.md names as differences (``Class::test`` or ``test_client::test`` in
    backquotes; ``Class::test[*]`` stands for each of its parametrizations)."""
    return set(re.findall(r"`((?:Test\w+|test_\w+)::[^`]+)`", KNOWN.read_text()))


def documented(test: str, known: set[str]) -> bool:
    return test in known or f"{test.split('[', 1)[0]}[*]" in known


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", action="append", choices=sorted(SUITES), help="default: every suite")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/llmguard-peer"))
    parser.add_argument("--python", default=sys.executable, help="the interpreter the venv is built from")
    parser.add_argument("--check", action="store_true", help="fail on a difference docs/compatibility.md omits")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument(
        "--retry-mode", choices=["guard", "cooperative"], default="guard", help="the Guards' RetryPolicy.mode"
    )
    parser.add_argument(
        "--budget-floor",
        type=int,
        help="the Guards' BudgetPolicy.floor (default: BudgetPolicy's), to tell a "
        "difference the retry budget makes from one the guard's faithfulness makes",
    )
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    known = known_differences()
    summary: dict[str, dict[str, object]] = {}
    unlisted: list[str] = []
    for suite in args.suite or list(SUITES):
        with locked(args.workdir):
            env = venv(args.workdir, suite, args.python)
            source = unpack(args.workdir, SUITES[suite], env)
        plain = outcomes(env, source, False)
        guarded = outcomes(env, source, True, args.retry_mode, args.budget_floor)
        differ = sorted(t for t, o in plain.items() if o == "passed" and guarded.get(t) != "passed")
        plain_ok = sum(o == "passed" for o in plain.values())
        guarded_ok = sum(o == "passed" for o in guarded.values())
        mode = "" if args.retry_mode == "guard" else f" ({args.retry_mode} retries)"
        if args.budget_floor is not None:
            mode += f" (BudgetPolicy(floor={args.budget_floor}))"
        print(f"{SUITES[suite]} tests/test_client.py: {plain_ok} pass plain, {guarded_ok} pass guarded{mode}")
        for test in differ:
            mark = "" if documented(test, known) else "   (not in docs/compatibility.md)"
            print(f"  passes plain, fails guarded: {test}{mark}")
            if not documented(test, known):
                unlisted.append(f"{suite}: {test}")
        summary[suite] = {"pin": SUITES[suite], "plain": plain_ok, "guarded": guarded_ok, "differences": differ}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    if args.check and unlisted:
        print(f"{len(unlisted)} difference(s) not listed in docs/compatibility.md", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
