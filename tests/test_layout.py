"""The layout keeps its promises: no import cycle, importing the runtime loads none of the tools, and the tools
(tools/llmguard_tools, a distribution of their own) use only the runtime's public API.

That no runtime module imports a tool (and that each layer imports only from those below it) is the layer
contract in pyproject.toml, checked by ``lint-imports`` in CI."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import llmguard_client
import llmguard_tools

PACKAGES = (Path(llmguard_client.__file__).parent, Path(llmguard_tools.__file__).parent)
HEAVY = ("rich", "matplotlib", "starlette", "uvicorn", "locust")
"""What the tools bring (tools/pyproject.toml): the runtime must load none of it."""


def _module_name(package: Path, path: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of every absolute import: at run time, inside functions and under
    TYPE_CHECKING alike (``import a.b`` names nothing)."""
    found: list[tuple[str, list[str], int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, [], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names], node.lineno))
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the runtime and the tools it imports."""
    modules = {_module_name(package, path): path for package in PACKAGES for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for module, names, _ in _imports(ast.parse(path.read_text(), str(path))):
            targets = [module, *(f"{module}.{n}" for n in names)]
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
        f"tools = [m for m in added if m.split('.')[0] in {(*HEAVY, 'llmguard_tools')!r}]\n"
        "print(sorted(tools), 'llmguard_client.guard' in added)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["[]", "True"]


PRIVATE_NAME = re.compile(r"\bllmguard_client(?:\.[A-Za-z0-9]\w*)*\._[A-Za-z]\w*")
"""A private module or name of the runtime spelled out (``llmguard_client._core``, ``llmguard_client.x._y``)."""


def private_uses(source: str, filename: str = "<tool>") -> list[str]:
    """Where ``source`` reaches past the runtime's public API: an import of a private module, or of a name that is
    not in the module's ``__all__`` (``llmguard_client``'s) or is private; a private module's dotted name
    anywhere (strings, ``importlib.import_module``, docstrings)."""
    found: list[str] = []
    for module, names, line in _imports(ast.parse(source, filename)):
        if module.split(".")[0] != "llmguard_client":
            continue
        if any(part.startswith("_") for part in module.split(".")[1:]):
            found.append(f"{filename}:{line}: {module}")
        elif module == "llmguard_client":
            public = set(llmguard_client.__all__)
            private = [n for n in names if n not in public and not _submodule(n)]
            found.extend(f"{filename}:{line}: llmguard_client.{n}" for n in private)
        else:
            found.extend(f"{filename}:{line}: {module}.{n}" for n in names if n.startswith("_"))
    for number, text in enumerate(source.splitlines(), 1):
        found.extend(f"{filename}:{number}: {m.group(0)}" for m in PRIVATE_NAME.finditer(text))
    return found


def _submodule(name: str) -> bool:
    """A public submodule of the runtime (``from llmguard_client import causes``)."""
    package = Path(llmguard_client.__file__).parent
    return not name.startswith("_") and ((package / f"{name}.py").is_file() or (package / name).is_dir())


def test_the_tools_use_only_the_runtimes_public_api() -> None:
    """What a tool needs from the runtime is public, so the tools ship in a distribution of their own."""
    tools = Path(llmguard_tools.__file__).parent
    found = [use for path in sorted(tools.rglob("*.py")) for use in private_uses(path.read_text(), str(path))]
    assert found == []


def test_the_public_api_check_finds_private_uses() -> None:
    source = (
        "from llmguard_client import Guard, causes\n"
        "from llmguard_client import ReplicaSet\n"
        "from llmguard_client._core.call import Call\n"
        "from llmguard_client.config import _internal\n"
        "import llmguard_client.telemetry._jsonl\n"
        "x = importlib.import_module('llmguard_client._routing.quantile')\n"
    )
    assert [use.split(": ", 1)[1] for use in private_uses(source)] == [
        "llmguard_client.ReplicaSet",
        "llmguard_client._core.call",
        "llmguard_client.config._internal",
        "llmguard_client.telemetry._jsonl",
        "llmguard_client._core",
        "llmguard_client.telemetry._jsonl",
        "llmguard_client._routing",
    ]
