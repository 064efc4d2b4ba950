"""Run the commands the docs show and write their real output into the docs (or check that it still matches).

    python scripts/render_docs.py                 # re-render every marked block in README.md and docs/*.md
    python scripts/render_docs.py --check [FILE]  # exit 1 when a block no longer matches what its command prints

Markers are HTML comments (invisible on GitHub), each directly before a fenced block:

- ``<!-- docs-file: NAME -->``: the block below is a file a reader saves as NAME; it is written into the
  doc's working directory before the commands after it run (so a guide's own code is what runs).
- ``<!-- docs-run: COMMAND -->``: COMMAND runs in bash in that directory, and the block below becomes
  ``$ COMMAND`` and its output. ``--check`` compares shapes: numbers, hex addresses and runs of spaces are
  masked, so figures that vary from run to run do not count, but a changed layout, flag or message does.
- ``<!-- docs-sample: COMMAND ==> REGEX -->``: the same, for output whose shape varies run to run (a
  verdict, simulated text): ``--check`` only requires COMMAND to succeed and one output line to match REGEX.

Each doc gets its own fresh working directory; its commands run in order, with ``llmguard`` and ``python``
meaning this checkout (``python -m llmguard_tools.cli``, this interpreter, ``PYTHONPATH`` = the checkout),
``COLUMNS=100`` so help texts wrap the same everywhere, and ``LLMGUARD_DISABLED`` unset.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/usage.md", "docs/rollout.md", "docs/fleet.md")
"""The files with markers; others are left alone."""
TIMEOUT = 120.0

_MARKER = re.compile(r"^<!-- docs-(file|run|sample): (.+?) -->\s*$")
_FENCE = re.compile(r"^(`{3,})(.*)$")
_NUMBER = re.compile(r"0x[0-9a-fA-F]+|[+-]?\d+(?:[.,]\d+)*")


@dataclass(frozen=True, slots=True)
class Block:
    """One marked fenced block: its marker and the line range of its body (fences excluded)."""

    kind: str
    arg: str
    start: int
    end: int

    @property
    def command(self) -> str:
        return self.arg.split(" ==> ", 1)[0].strip()

    @property
    def expect(self) -> str | None:
        parts = self.arg.split(" ==> ", 1)
        return parts[1].strip() if len(parts) == 2 else None


class DocError(Exception):
    """A marker without a block, or a command that failed."""


def blocks(lines: Sequence[str], name: str) -> Iterator[Block]:
    """The marked blocks of a doc, in order."""
    i = 0
    while i < len(lines):
        match = _MARKER.match(lines[i])
        if match is None:
            i += 1
            continue
        fence = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if fence is None:
            raise DocError(f"{name}:{i + 1}: a docs-{match[1]} marker must be followed at once by a ``` block")
        close = next((j for j in range(i + 2, len(lines)) if lines[j].rstrip() == fence[1]), None)
        if close is None:
            raise DocError(f"{name}:{i + 2}: the ``` block after the marker is never closed")
        yield Block(match[1], match[2], i + 2, close)
        i = close + 1


def shape(text: str) -> list[str]:
    """What --check compares: numbers and hex masked, spaces collapsed, blank lines dropped."""
    masked = (" ".join(_NUMBER.sub("N", line).split()) for line in text.splitlines())
    return [line for line in masked if line]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _shims(folder: Path) -> dict[str, str]:
    for name, target in (("llmguard", f'"{sys.executable}" -m llmguard_tools.cli'), ("python", f'"{sys.executable}"')):
        shim = folder / name
        shim.write_text(f'#!/usr/bin/env bash\nexec {target} "$@"\n', encoding="utf-8")
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "LLMGUARD_DISABLED"}
    env.update(
        PATH=f"{folder}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tools")]),
        COLUMNS="100",
        NO_COLOR="1",
        TERM="dumb",
        PYTHONWARNINGS="ignore",
        FLEET_PORT=str(_free_port()),  # the fleet recipe's Redis, apart from any other run's
    )
    return env


def run(command: str, cwd: Path, env: dict[str, str], where: str) -> str:
    """``$ command`` and what it printed (stdout then stderr); DocError if it failed."""
    proc = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    if proc.returncode != 0:
        raise DocError(f"{where}: `{command}` exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    output = "\n".join(line.rstrip() for line in (proc.stdout + proc.stderr).rstrip("\n").split("\n"))
    return f"$ {command}\n{output}" if output else f"$ {command}"


def process(path: Path, *, check: bool) -> list[str]:
    """Render (or check) one doc; returns the problems found (check) or [] after rewriting it."""
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    problems: list[str] = []
    replacements: list[tuple[Block, list[str]]] = []
    with tempfile.TemporaryDirectory(prefix="llmguard-docs-") as tmp:
        work, bin_dir = Path(tmp) / "work", Path(tmp) / "bin"
        work.mkdir()
        bin_dir.mkdir()
        env = _shims(bin_dir)
        venv = work / ".venv"  # the README's `.venv/bin/...` commands, after its install line
        venv.mkdir()
        (venv / "bin").symlink_to(bin_dir, target_is_directory=True)
        for block in blocks(lines, name):
            body = "\n".join(lines[block.start : block.end])
            where = f"{name}:{block.start}"
            if block.kind == "file":
                (work / block.arg.strip()).write_text(body + "\n", encoding="utf-8")
                continue
            try:
                fresh = run(block.command, work, env, where)
            except (DocError, subprocess.TimeoutExpired) as exc:
                problems.append(str(exc))
                continue
            if check:
                problems += _compare(block, body, fresh, where)
            else:
                replacements.append((block, fresh.split("\n")))
    if not check and not problems:
        for block, new in reversed(replacements):
            lines[block.start : block.end] = new
        path.write_text("\n".join(lines), encoding="utf-8")
    return problems


def _compare(block: Block, body: str, fresh: str, where: str) -> list[str]:
    if block.expect is not None:
        pattern = re.compile(block.expect)
        if any(pattern.search(line) for line in fresh.splitlines()):
            return []
        return [f"{where}: no line of `{block.command}`'s output matches {block.expect!r}:\n{fresh}"]
    if shape(body) == shape(fresh):
        return []
    diff = difflib.unified_diff(body.splitlines(), fresh.splitlines(), "in the doc", "printed now", lineterm="")
    return [
        f"{where}: `{block.command}` prints something else now (re-render with scripts/render_docs.py):\n"
        + "\n".join(diff)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare, do not rewrite; exit 1 on a mismatch")
    parser.add_argument("files", nargs="*", help=f"docs to process (default: {', '.join(DOCS)})")
    args = parser.parse_args(argv)
    paths = [Path(f).resolve() for f in args.files] or [ROOT / d for d in DOCS]
    problems: list[str] = []
    for path in paths:
        try:
            problems += process(path, check=args.check)
        except DocError as exc:
            problems.append(str(exc))
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
