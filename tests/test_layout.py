"""The package's layout keeps its promises: no import cycle, and importing the runtime loads none of the tools.

That no runtime module imports a tool (and that each layer imports only from those below it) is the layer
contract in pyproject.toml, checked by ``lint-imports`` in CI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import llmguard_client

PACKAGE = Path(llmguard_client.__file__).parent
TOOLS = ("sim", "bench", "compare", "cli", "loadtest")
"""Subpackages and modules that serve people (simulator, benchmarks, comparison, CLI, load tests), never a call."""
HEAVY = ("rich", "matplotlib", "starlette", "uvicorn", "locust")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports: at run time, inside functions and under TYPE_CHECKING alike."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_importing_the_package_loads_none_of_the_tools() -> None:
    # httpx imports its own command line (and with it rich) whenever rich is installed: the baseline is what the
    # runtime dependencies load by themselves, and the package must add no tool and no heavy module to it.
    probe = (
        "import sys\n"
        "import anyio, httpx, opentelemetry.trace\n"
        "before = set(sys.modules)\n"
        "import llmguard_client\n"
        "from llmguard_client import Guard\n"
        "added = set(sys.modules) - before\n"
        f"tools = [m for m in added if m.split('.')[0] in {HEAVY!r} "
        f"or (m.startswith('llmguard_client.') and m.split('.')[1] in {TOOLS!r})]\n"
        "print(sorted(tools), 'llmguard_client.guard' in added)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["[]", "True"]


def test_the_tools_use_only_the_runtimes_public_modules() -> None:
    """What a tool needs from the runtime is public, so the tools can ship in a distribution of their own."""

    def _is_tool(module: str) -> bool:
        return module.split(".")[1:2] != [] and module.split(".")[1] in TOOLS

    graph = import_graph()
    private = {
        module: sorted(t for t in targets if not _is_tool(t) and any(p.startswith("_") for p in t.split(".")[1:]))
        for module, targets in graph.items()
        if _is_tool(module)
    }
    assert {module: targets for module, targets in private.items() if targets} == {}
