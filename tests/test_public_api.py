"""The public surface: __all__, __version__, import cost, and the typing marker."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.resources
import inspect
import re
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

import llmguard_client
from tests.probe import modules_after_import

ROOT = Path(__file__).resolve().parents[1]


def isort_key(name: str) -> tuple[int, str]:
    """RUF022's "isort-style" order: CONSTANTS, then CamelCase, then everything else, each sorted."""
    if name.isupper() and len(name) > 1:
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def test_all_is_sorted() -> None:
    names = list(llmguard_client.__all__)
    assert names == sorted(names, key=isort_key)


def test_all_has_no_duplicates() -> None:
    assert len(set(llmguard_client.__all__)) == len(llmguard_client.__all__)


def test_every_name_in_all_is_importable() -> None:
    namespace: dict[str, object] = {}
    exec(f"from llmguard_client import {', '.join(llmguard_client.__all__)}", namespace)
    for name in llmguard_client.__all__:
        assert namespace[name] is getattr(llmguard_client, name)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from llmguard_client import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(llmguard_client.__all__)


def test_core_names_are_exported() -> None:
    for name in ("Guard", "Tier", "Replica", "GuardTransport", "PhaseRecord", "GuardConfigError", "UnknownTierError"):
        assert name in llmguard_client.__all__


def test_version_is_a_string() -> None:
    assert isinstance(llmguard_client.__version__, str)
    assert llmguard_client.__version__
    assert "__version__" in llmguard_client.__all__


def test_importing_the_package_does_not_import_the_tools() -> None:
    loaded = sorted(m for m in modules_after_import() if m.startswith("llmguard_"))
    assert "llmguard_client" in loaded and "llmguard_client.guard" in loaded  # the probe really imported it
    assert [m for m in loaded if m.split(".")[0] == "llmguard_tools"] == []


def test_importing_the_package_does_not_import_the_sim_extras_server_or_plotting() -> None:
    assert [m for m in ("uvicorn", "starlette", "matplotlib") if m in modules_after_import()] == []


def test_the_wheel_ships_the_typing_marker_and_the_license() -> None:
    """Ask hatchling (the build backend) what the wheel would contain: it honours .gitignore, so an
    ignored py.typed would silently drop out. No git needed, so this runs from an sdist too."""
    marker = importlib.resources.files("llmguard_client").joinpath("py.typed")
    assert marker.is_file()
    wheel = pytest.importorskip("hatchling.builders.wheel")
    builder = wheel.WheelBuilder(str(ROOT))
    shipped = {f.distribution_path for f in builder.recurse_included_files()}
    assert "llmguard_client/py.typed" in shipped
    assert "llmguard_client/guard.py" in shipped
    # The runtime only: the simulator, bench, comparison and load tests ship in llmguard-tools (tools/).
    assert {path.split("/")[0] for path in shipped} <= {"llmguard_client", "LICENSE", "README.md"}
    tools = ("sim", "bench", "compare", "loadtest", "cli.py")
    assert [path for path in shipped if path.split("/")[1:2] and path.split("/")[1] in tools] == []
    assert builder.metadata.core.license_files == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")


def test_no_test_needs_git() -> None:
    """The suite must pass from an sdist, where there is no .git: no test may call the git CLI."""
    git_call = re.compile(r"""\[\s*["']git["']""")
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("*.py") if git_call.search(p.read_text())]
    assert offenders == []


def test_the_package_imports_and_runs_without_opentelemetry() -> None:
    """opentelemetry-api is optional at import: with it hidden, the package imports, a default Guard
    falls back to no instrumentation, and a call goes through."""
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None  # as if opentelemetry-api were not installed\n"
        "import anyio, httpx\n"
        "import llmguard_client\n"
        "from llmguard_client import Guard\n"
        "async def main():\n"
        "    ok = httpx.MockTransport(lambda r: httpx.Response(200, json={'ok': True}))\n"
        "    for inst in ({}, {'instrumentation': None}):\n"
        "        guard = Guard(['http://a'], transport_factory=lambda r: ok, **inst)\n"
        "        async with guard.http_client() as client:\n"
        "            assert (await client.get('http://a/v1/models')).json() == {'ok': True}\n"
        "        await guard.aclose()\n"
        "anyio.run(main)\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
        "try:\n"
        "    llmguard_client.OpenTelemetryInstrumentation\n"
        "except ImportError as exc:\n"
        "    print('lazy:', type(exc).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['opentelemetry']", "lazy: ModuleNotFoundError"]


def test_the_wheel_config_includes_the_package_and_its_marker() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert wheel["packages"] == ["llmguard_client"]
    assert not any("py.typed" in pattern for pattern in wheel.get("exclude", []))
    assert "Typing :: Typed" in pyproject["project"]["classifiers"]


def _annotated(name: str, obj: object) -> list[tuple[str, object]]:
    """``obj`` and, for a class, its public methods, ``__init__`` and properties: what get_type_hints is asked of."""
    if not inspect.isclass(obj):
        return [(name, obj)] if inspect.isfunction(obj) else []
    members: list[tuple[str, object]] = [(name, obj)]
    for attribute, value in vars(obj).items():
        if attribute.startswith("_") and attribute != "__init__":
            continue
        if isinstance(value, property):
            members.append((f"{name}.{attribute}", value.fget))
        elif isinstance(value, (staticmethod, classmethod)):
            members.append((f"{name}.{attribute}", value.__func__))
        elif inspect.isfunction(value):
            members.append((f"{name}.{attribute}", value))
    return members


@pytest.mark.parametrize("module", ["llmguard_client", "llmguard_client.server_hints"])
def test_the_public_api_resolves_its_type_hints_at_run_time(module: str) -> None:
    """FastAPI (``def health() -> GuardSnapshot``), pydantic's TypeAdapter and other run-time readers of annotations
    call typing.get_type_hints: every public class, method and function must resolve, on each Python supported."""
    public = importlib.import_module(module)
    failures = []
    for name in public.__all__:
        for label, obj in _annotated(name, getattr(public, name)):
            try:
                typing.get_type_hints(obj)
            except Exception as exc:  # each failure is listed
                failures.append(f"{label}: {type(exc).__name__}: {exc}")
    assert failures == []


def _our_classes(hint: object, found: set[type]) -> None:
    """The package's classes ``hint`` names (in unions, generics, ...) and, for a dataclass, those its fields do."""
    if not isinstance(hint, type):
        for argument in typing.get_args(hint):
            _our_classes(argument, found)
        return
    if hint in found or not hint.__module__.startswith("llmguard_client"):
        return
    found.add(hint)
    if dataclasses.is_dataclass(hint):
        for field_hint in typing.get_type_hints(hint).values():
            _our_classes(field_hint, found)


def test_every_class_the_public_api_hands_out_is_exported() -> None:
    """What a user annotates with (``guard.snapshot().fleet``: FleetSnapshot, ``guard.capture()``: Capture) imports
    from the top level, not from a private module."""
    found: set[type] = set()
    for name in llmguard_client.__all__:
        for _, obj in _annotated(name, getattr(llmguard_client, name)):
            if dataclasses.is_dataclass(obj):
                _our_classes(obj, found)
            elif not inspect.isclass(obj):
                _our_classes(typing.get_type_hints(obj).get("return"), found)
    # The instrumentation hooks' types are documented (docs/observability.md) in llmguard_client.telemetry.hooks.
    hooks = importlib.import_module("llmguard_client.telemetry.hooks")
    exported = [c for c in found if getattr(llmguard_client, c.__name__, None) is c or c.__name__ in hooks.__all__]
    missing = sorted(c.__name__ for c in found.difference(exported))
    assert missing == [], missing


PUBLIC_MODULES = (
    "llmguard_client",
    "llmguard_client.server_hints",
    "llmguard_client.telemetry.otel",
    "llmguard_client.telemetry.hooks",
    "llmguard_client.protocols",
)
"""The modules whose ``__all__`` the docs name."""


def _public_docstrings() -> Iterator[tuple[str, str]]:
    """(label, docstring) of each public module, its ``__all__`` names and their classes' public members, and the
    modules (of public paths) those are defined in: what ``help()`` shows a user."""
    modules = set(PUBLIC_MODULES)
    for module_name in PUBLIC_MODULES:
        public = importlib.import_module(module_name)
        for name in public.__all__:
            obj = getattr(public, name)
            home = getattr(obj, "__module__", None)
            if isinstance(home, str) and home.startswith("llmguard_client") and "._" not in home:
                modules.add(home)
            for label, member in _annotated(name, obj):
                if member.__doc__:
                    yield f"{module_name}.{label}", member.__doc__
    for module_name in sorted(modules):
        yield module_name, importlib.import_module(module_name).__doc__ or ""


def test_public_docstrings_name_no_private_module_nor_our_tests() -> None:
    """``help(Guard)`` cited ``llmguard_client._core.clock`` and "Tests inject none": names a user cannot import
    and our process, not theirs."""
    private = re.compile(r"llmguard_client\._\w+|\btests?/|\bTests\b")
    found = [f"{label}: {m.group(0)}" for label, doc in _public_docstrings() for m in private.finditer(doc)]
    assert found == []


def test_guard_shows_its_built_per_guard_defaults_readably() -> None:
    """help(Guard) showed ``hedge=<object object at 0x...>``, then ``clock=<function loop_clock at 0x...>``."""
    parameters = inspect.signature(llmguard_client.Guard).parameters
    for name in ("hedge", "retry", "budget", "instrumentation", "clock"):
        assert repr(parameters[name].default) == "<default>"
    assert [name for name, p in parameters.items() if " at 0x" in repr(p.default)] == []


def _classes_in(hint: object) -> Iterator[type]:
    if isinstance(hint, type):
        yield hint
    for arg in typing.get_args(hint):
        yield from _classes_in(arg)


def test_public_functions_take_and_return_only_public_types() -> None:
    """``server_hints.poll_once`` took a ``ReplicaSet``, a private type a user could only reach through
    ``guard._replica_set``: a public signature names only types a user can import."""
    modules = [llmguard_client, importlib.import_module("llmguard_client.server_hints")]
    public = {id(getattr(m, name)) for m in modules for name in m.__all__}
    private = []
    for module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            if not inspect.isfunction(obj):
                continue
            for hint in typing.get_type_hints(obj).values():
                for cls in _classes_in(hint):
                    if cls.__module__.startswith("llmguard_client") and id(cls) not in public:
                        private.append(f"{name}: {cls.__module__}.{cls.__qualname__}")
    assert private == []


@pytest.mark.parametrize("module", ["llmguard_client", "llmguard_client.server_hints"])
def test_usage_md_api_reference_names_every_export(module: str) -> None:
    """docs/usage.md's API reference and ``__all__`` kept in step: each exported name has its line there."""
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    reference = usage[usage.index("\n## API reference\n") :]
    named = set(re.findall(r"`(\w+)", reference))
    assert sorted(set(importlib.import_module(module).__all__) - named) == []
