"""Build the sdist and the wheel, install the wheel alone in fresh venvs, and make real calls with it.

    python scripts/wheel_smoke.py                  # this checkout
    python scripts/wheel_smoke.py --source DIR     # another checkout (e.g. an older commit's worktree)

Steps, each printed on one line; the first failure prints its output and exits 1:

1. ``python -m build`` the sdist, then the wheel from the sdist (with the build backend of this interpreter);
   the wheel must hold the runtime only (``llmguard_client/``: no simulator, bench, compare or load-test code,
   which ship in llmguard-tools) and one command, ``llmguard-rollout``.
2. For each dependency set, a fresh venv with the wheel and nothing else (no extras, no test packages):
   ``newest``: whatever pip resolves today, on this interpreter; ``oldest``: every runtime dependency held to
   its declared minimum (a constraints file ``name==X.Y.*`` written from the wheel's own ``Requires-Dist``, so it
   cannot drift), on the oldest Python the wheel declares (``Requires-Python``), found on ``PATH`` or under
   pyenv; where there is none, on this interpreter, saying so.
3. In each venv, ``pip check``, then ``scripts/wheel_smoke_call.py`` (copied out of the checkout and run with
   ``python -I``, so the installed wheel is the only llmguard_client it can import): a plain and a streamed
   call through ``guard.http_client()`` against a stdlib ``http.server`` on 127.0.0.1; ``llmguard-rollout
   --help``.
4. In the ``oldest`` venv, then, the ``[fleet]`` extra at its declared minimum (``redis==X.Y.Z``, from the wheel's
   ``Requires-Dist`` with ``extra == "fleet"``), and ``scripts/wheel_smoke_fleet.py`` against a ``redis-server``
   started here on a free loopback port: a ``Guard(fleet=...)`` stays connected while idle for four times its
   socket timeout, and ``llmguard-rollout set``/``get`` exit 0 (~6 s). Without ``redis-server`` on ``PATH`` the
   step is skipped, saying so, except under CI (``CI=true``), where it fails: ``.ci/run`` installs it.
"""

from __future__ import annotations

import argparse
import contextlib
import email.parser
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALL = Path(__file__).resolve().with_name("wheel_smoke_call.py")
FLEET = Path(__file__).resolve().with_name("wheel_smoke_fleet.py")
_FLEET_EXTRA = re.compile(r";\s*extra\s*==\s*['\"]fleet['\"]\s*$")
_OLDEST_PYTHON = re.compile(r">=\s*(3\.[0-9]+)(?:\.0)?")
_LOWER_BOUND = re.compile(r"^([A-Za-z0-9._-]+)\s*(?:\[[^\]]*\])?\s*\(?\s*[^;]*?>=\s*([0-9][0-9A-Za-z.]*)")


class SmokeError(Exception):
    """A step failed; the message holds its command and output."""


def step(what: str, command: Sequence[str | Path], cwd: Path | None = None) -> str:
    """Run one command; print ``what`` and its time; SmokeError with its output if it fails."""
    started = time.monotonic()
    proc = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SmokeError(f"FAILED: {what}\n$ {' '.join(map(str, command))}\n{proc.stdout}{proc.stderr}")
    print(f"ok   {what} ({time.monotonic() - started:.1f} s)", flush=True)
    return proc.stdout


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def runtime_requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines that no extra guards: what a bare ``pip install`` brings."""
    return [req for req in wheel_metadata(wheel).get_all("Requires-Dist") or [] if "extra ==" not in req]


def fleet_requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines of the ``[fleet]`` extra, without their marker."""
    reqs = wheel_metadata(wheel).get_all("Requires-Dist") or []
    return [_FLEET_EXTRA.sub("", req).strip() for req in reqs if _FLEET_EXTRA.search(req)]


def oldest_python(requires_python: str) -> str:
    """``X.Y`` of a ``Requires-Python`` of the form ``>=X.Y``; SmokeError for any other form."""
    match = _OLDEST_PYTHON.fullmatch(requires_python.strip())
    if match is None:
        raise SmokeError(f"FAILED: Requires-Python {requires_python!r} is not '>=X.Y': no oldest Python to test on")
    return match[1]


def find_python(version: str) -> Path | None:
    """An interpreter of Python ``version`` (``X.Y``): ``pythonX.Y`` on PATH, else the newest pyenv build of it."""
    for candidate in [shutil.which(f"python{version}"), *_pyenv_builds(version)]:
        if candidate is None:
            continue
        proc = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
        )
        if proc.returncode == 0 and proc.stdout.strip() == version:
            return Path(candidate)
    return None


def _pyenv_builds(version: str) -> list[str]:
    """pyenv's builds of Python ``version``, the newest patch release first."""
    proc = subprocess.run(["pyenv", "root"], capture_output=True, text=True) if shutil.which("pyenv") else None
    if proc is None or proc.returncode != 0:
        return []
    builds = Path(proc.stdout.strip(), "versions").glob(f"{version}.*/bin/python{version}")
    return [str(build) for build in sorted(builds, key=_patch_level, reverse=True)]


def _patch_level(build: Path) -> int:
    """The patch release of a pyenv build ``.../versions/X.Y.Z/bin/pythonX.Y`` (3.10.13 after 3.10.9); -1 for a
    name of another form (``3.10-dev``)."""
    patch = build.parents[1].name.split(".")[-1]
    return int(patch) if patch.isdigit() else -1


def minima(requirements: Sequence[str], exact: bool = False) -> list[str]:
    """``name==X.Y.*`` for each requirement's declared lower bound (>=X.Y), ``name==X.Y.Z`` with ``exact`` (a
    bound that names a patch release: ``redis>=5.0.1`` excludes 5.0.0); one without a bound is an error."""
    pins = []
    for req in requirements:
        match = _LOWER_BOUND.match(req)
        if match is None:
            raise SmokeError(f"FAILED: {req!r} declares no lower bound (>=): the oldest set cannot be tested")
        pins.append(f"{match[1]}=={match[2]}" if exact else f"{match[1]}=={match[2]}.*")
    return pins


TOOLS = ("sim", "bench", "compare", "loadtest", "cli.py")
"""What llmguard-tools ships (tools/), and the runtime wheel must not."""


def check_contents(wheel: Path) -> None:
    """The wheel holds ``llmguard_client`` and its metadata only, no tool, and ``llmguard-rollout`` as its command."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        scripts = archive.read(entry_points).decode() if entry_points else ""
    stray = [n for n in names if n.split("/")[0] != "llmguard_client" and ".dist-info/" not in n]
    tools = [n for n in names if n.split("/")[0] == "llmguard_client" and n.split("/")[1] in TOOLS]
    commands = [line.split("=")[0].strip() for line in scripts.splitlines() if "=" in line]
    if stray or tools or commands != ["llmguard-rollout"]:
        raise SmokeError(f"FAILED: {wheel.name} holds {stray + tools} beside the runtime, commands {commands}")
    print(f"ok   {wheel.name}: {len(names)} files, the runtime only; command llmguard-rollout")


def smoke(source: Path, work: Path, sets: Sequence[str]) -> None:
    dist = work / "dist"
    step(f"build sdist + wheel of {source}", [sys.executable, "-m", "build", "--no-isolation", "-o", dist, source])
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    print(f"     {sdist.name}, {wheel.name}")
    check_contents(wheel)
    call = work / "call.py"
    shutil.copy(CALL, call)
    for name in sets:
        venv = work / f"venv-{name}"
        python = venv / "bin" / "python"
        base, version = base_python(name, wheel)
        step(f"[{name}] fresh venv on Python {version}", [base, "-m", "venv", venv])
        install: list[str | Path] = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input"]
        if name == "oldest":
            constraints = work / "minima.txt"
            pins = minima(runtime_requirements(wheel))
            constraints.write_text("\n".join(pins) + "\n", encoding="utf-8")
            print(f"     constraints: {', '.join(pins)}")
            install += ["-c", constraints]
        step(f"[{name}] pip install {wheel.name} (alone)", [*install, wheel])
        step(f"[{name}] pip check", [python, "-m", "pip", "check", "--disable-pip-version-check"])
        print("     " + step(f"[{name}] calls", [python, "-I", call], cwd=work).strip())
        step(f"[{name}] llmguard-rollout --help", [venv / "bin" / "llmguard-rollout", "--help"], cwd=work)
        if name == "oldest":
            fleet_smoke(wheel, work, install, python)


def fleet_smoke(wheel: Path, work: Path, install: Sequence[str | Path], python: Path) -> None:
    """The ``[fleet]`` extra at its declared minimum in the venv that ran the bare calls, against a real
    ``redis-server`` (see the module docstring, step 4)."""
    server = shutil.which("redis-server")
    if server is None:
        if os.environ.get("CI") == "true":
            raise SmokeError(
                "FAILED: redis-server is not installed; .ci/run installs it (apt-get install redis-server)"
            )
        print("     no redis-server on PATH: the [fleet] extra at its minimum is not checked")
        return
    pins = minima(fleet_requirements(wheel), exact=True)
    constraints = work / "fleet-minima.txt"
    constraints.write_text("\n".join(pins) + "\n", encoding="utf-8")
    print(f"     [fleet] constraints: {', '.join(pins)}")
    step(f"[oldest] pip install {wheel.name}[fleet]", [*install, "-c", constraints, f"{wheel}[fleet]"])
    step("[oldest] pip check (with [fleet])", [python, "-m", "pip", "check", "--disable-pip-version-check"])
    script = work / "fleet.py"
    shutil.copy(FLEET, script)
    with redis_server(server, work) as url:
        print(
            "     "
            + step(
                "[oldest] fleet: idle Guard stays connected, llmguard-rollout", [python, "-I", script, url], cwd=work
            ).strip()
        )


@contextlib.contextmanager
def redis_server(server: str, work: Path) -> Iterator[str]:
    """A ``redis-server`` on a free loopback port, no persistence, killed on exit; its URL once it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", work]
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10.0
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(64).startswith(b"+PONG"):  # not any reply: a socket can connect to itself
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SmokeError(f"FAILED: redis-server did not start on port {port}")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def base_python(name: str, wheel: Path) -> tuple[Path, str]:
    """The interpreter a set's venv is made from, and its version: the oldest declared Python for ``oldest``
    (where this machine has one), this interpreter otherwise."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if name == "oldest":
        version = oldest_python(wheel_metadata(wheel).get("Requires-Python", ""))
        found = find_python(version)
        if found is not None:
            return found, version
        print(f"     no Python {version} on this machine: the oldest set runs on Python {here}")
    return Path(sys.executable), here


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout to build (default: this one)")
    parser.add_argument("--only", choices=("newest", "oldest"), help="one dependency set (default: both)")
    args = parser.parse_args(argv)
    sets = [args.only] if args.only else ["newest", "oldest"]
    with tempfile.TemporaryDirectory(prefix="llmguard-wheel-") as tmp:
        try:
            smoke(args.source.resolve(), Path(tmp), sets)
        except SmokeError as exc:
            print(exc, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
