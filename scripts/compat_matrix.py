"""The compatibility matrix: one venv per cell under /tmp, a probe in each, a table in docs/compatibility.md.

    python scripts/compat_matrix.py [--jobs 2] [--only NAME ...] [--out docs/compatibility.md]

Cells: openai latest 1.x, 2.x and 3.x; httpx 0.27 and 0.28; httpx2; the lowest declared version of
every runtime dependency; and the newest set on each Python from 3.10 to 3.13 found on this machine.
In each venv it installs this checkout (editable) with the cell's pins, runs `scripts/compat_probe.py`
(streamed, non-streamed and give-up calls, async and sync, against a loopback server) and, for the
openai cells, ``mypy --strict`` on the user-side example files. ~2 min per cell on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENVS = Path("/tmp/llmguard-compat")
SERVER = ["uvicorn>=0.30", "starlette>=0.37"]  # the probe's loopback server
LOWEST = ["httpx==0.27.0", "anyio==4.4.0", "opentelemetry-api==1.40.0"]
KEEP_MARKER = "<!-- compat_matrix.py keeps everything below this line -->"
TYPED_EXAMPLES = ["examples/openai_async.py", "examples/openai_sync.py"]


@dataclass
class Cell:
    name: str
    python: str
    pins: list[str]
    typing: list[str] = field(default_factory=list)
    """Files to run ``mypy --strict`` on in this cell."""


CELLS = [
    Cell(
        "openai 1.x, httpx 0.28",
        "3.11",
        ["openai>=1,<2", "httpx>=0.28,<0.29"],
        [*TYPED_EXAMPLES, "scripts/typing/openai_v1_v2.py"],
    ),
    Cell("openai 1.x, httpx 0.27", "3.11", ["openai>=1,<2", "httpx>=0.27,<0.28"]),
    Cell(
        "openai 2.x, httpx 0.28",
        "3.11",
        ["openai>=2,<3", "httpx>=0.28,<0.29"],
        [*TYPED_EXAMPLES, "scripts/typing/openai_v1_v2.py"],
    ),
    Cell("openai 3.x, httpx2", "3.11", ["openai>=3", "httpx2"], [*TYPED_EXAMPLES, "scripts/typing/openai_v3.py"]),
    # Early 3.x releases: langchain-openai, instructor, pydantic-ai and litellm installed together resolve openai 3.3.
    Cell("openai 3.0, httpx2", "3.11", ["openai>=3.0,<3.1", "httpx2"]),
    Cell("openai 3.3, httpx2", "3.11", ["openai>=3.3,<3.4", "httpx2"]),
    Cell("lowest declared (+ openai 1.40, the test extra's floor)", "3.11", [*LOWEST, "openai==1.40.0"]),
    Cell("lowest httpx2 (2.12; it needs anyio>=4.10)", "3.11", ["httpx2==2.12.0", "anyio==4.10.0", "openai>=3"]),
    Cell("anthropic latest, httpx2", "3.11", ["anthropic", "httpx2"]),
    Cell("no openai, httpx 0.27 + httpx2", "3.11", ["httpx>=0.27,<0.28", "httpx2"]),
    Cell("Python 3.10, newest", "3.10", ["openai"]),
    Cell("Python 3.12, newest", "3.12", ["openai", "httpx2"]),
    Cell("Python 3.13, newest", "3.13", ["openai", "httpx2"]),
]


def interpreter(version: str) -> str | None:
    found = shutil.which(f"python{version}")
    candidates = sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}"))
    for path in [found, *map(str, candidates)]:
        if path and subprocess.run([path, "-c", "pass"], capture_output=True).returncode == 0:
            return path
    return None


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def run_cell(cell: Cell) -> dict[str, Any]:
    started = time.monotonic()
    python = interpreter(cell.python)
    if python is None:
        return {"cell": cell.name, "skipped": f"no Python {cell.python} on this machine"}
    venv = VENVS / slug(cell.name)
    shutil.rmtree(venv, ignore_errors=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps = [
        [python, "-m", "venv", str(venv)],
        [*pip, "-e", str(ROOT), *SERVER, *cell.pins, *(["mypy>=1.11"] if cell.typing else [])],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            return {"cell": cell.name, "error": f"{' '.join(step[:6])}...: {_tail(done.stderr)}"}
    probe = subprocess.run(
        [str(venv / "bin/python"), "scripts/compat_probe.py"], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    try:
        report: dict[str, Any] = json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"cell": cell.name, "error": f"probe crashed: {_tail(probe.stderr)}"}
    report["cell"] = cell.name
    if cell.typing:
        typed = subprocess.run(
            [str(venv / "bin/python"), "-m", "mypy", "--strict", "--cache-dir", str(venv / "mypy-cache"), *cell.typing],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        report["mypy"] = _tail(typed.stdout, 600) if typed.returncode else "ok: " + typed.stdout.strip()
    report["seconds"] = round(time.monotonic() - started)
    (venv / "report.json").write_text(json.dumps(report))
    return report


def _stored(cell: Cell) -> dict[str, Any] | None:
    """A cell's report from an earlier run (``--only`` re-runs some cells and keeps the others)."""
    path = VENVS / slug(cell.name) / "report.json"
    return json.loads(path.read_text()) if path.exists() else None


def _tail(text: str, limit: int = 800) -> str:
    lines = [line for line in text.strip().splitlines() if not line.startswith("WARNING: Location")]
    return "\n".join(lines)[-limit:]


def render(reports: list[dict[str, Any]], command: str) -> str:
    out = [
        "# Compatibility matrix",
        "",
        f"Produced by `{command}` (a venv per cell under {VENVS}; the probe is `scripts/compat_probe.py`,",
        'run against a loopback server). "ok" means the call returned the expected content, or, for a',
        'give-up, the expected error type with `guard_failure(exc) == "ttft_timeout"` and the server',
        "request count shown (1 = nothing stacked). `record:` is the captured phase record's status.",
        "",
        "| cell | Python | versions | checks passed | mypy --strict (user-side files) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for report in reports:
        if "results" not in report:
            out.append(f"| {report['cell']} | - | - | not run | - |")
            continue
        checks = [r for client in report["results"].values() for r in client.values()]
        passed = sum(r.startswith("ok") for r in checks)
        versions = ", ".join(
            f"{k} {v}" for k, v in report["versions"].items() if v and k in ("openai", "anthropic", "httpx", "httpx2")
        )
        mypy = ("ok" if report["mypy"].startswith("ok") else "FAIL") if "mypy" in report else "-"
        out.append(f"| {report['cell']} | {report['python']} | {versions} | {passed}/{len(checks)} | {mypy} |")
    out.append("")
    for report in reports:
        out.append(f"## {report['cell']}")
        out.append("")
        if "skipped" in report or "error" in report:
            out += [f"Not run: {report.get('skipped') or report.get('error')}", ""]
            continue
        versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)
        out += [f"Python {report['python']}; {versions}.", ""]
        if "crash" in report:
            out += ["Probe crashed:", "", "```", report["crash"], "```", ""]
        out += ["| client | check | result |", "| --- | --- | --- |"]
        for client, checks in report["results"].items():
            for check, result in checks.items():
                out.append(f"| {client} | {check} | {result} |")
        if "mypy" in report:
            out += ["", f"`mypy --strict` on the user-side files: {report['mypy']}"]
        out.append("")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="run only cells whose name contains one of these")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/compatibility.md")
    parser.add_argument("--render-only", action="store_true", help="rewrite the table from the stored reports")
    args = parser.parse_args()
    cells = [c for c in CELLS if not args.only or any(o in c.name for o in args.only)]
    if args.render_only:
        cells = []
    VENVS.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        fresh = {r["cell"]: r for r in pool.map(run_cell, cells)}
    reports = [fresh.get(c.name) or _stored(c) for c in CELLS]
    reports = [r for r in reports if r is not None]
    kept = ""  # the hand-written sections after the matrix (the SDKs' own suites, `scripts/peer_suites.py`)
    if args.out.exists() and KEEP_MARKER in args.out.read_text():
        kept = "\n" + KEEP_MARKER + "\n\n" + args.out.read_text().split(KEEP_MARKER, 1)[1].lstrip("\n")
    args.out.write_text(render(reports, "python scripts/compat_matrix.py") + "\n" + kept)
    failed = [r["cell"] for r in reports if "error" in r or "crash" in r or "FAIL" in json.dumps(r.get("results"))]
    print(f"wrote {args.out}; {len(reports)} cells, failing: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
