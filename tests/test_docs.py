"""The docs' commands and sample outputs come from real runs: ``scripts/render_docs.py --check`` in the suite."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_docs"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


render_docs = load_renderer()


@pytest.mark.parametrize("doc", render_docs.DOCS)
def test_the_docs_show_what_their_commands_print(doc: str) -> None:
    """Every marked command still runs, and its block still has the shape of what it prints now."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render_docs.py"), "--check", doc],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_each_rendered_doc_has_markers() -> None:
    for doc in render_docs.DOCS:
        lines = (ROOT / doc).read_text(encoding="utf-8").split("\n")
        runs = [b for b in render_docs.blocks(lines, doc) if b.kind != "file"]
        assert runs, f"{doc} has no docs-run/docs-sample marker"
        assert all(lines[b.start].startswith("$ ") for b in runs), f"{doc} has a marked block never rendered"


def test_the_readme_quickstart_is_the_example_file() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").split("\n")
    (block,) = [b for b in render_docs.blocks(lines, "README.md") if b.kind == "file"]
    quickstart = "\n".join(lines[block.start : block.end])
    assert quickstart in (ROOT / "examples" / "openai_quickstart.py").read_text(encoding="utf-8")


def test_the_docs_python_files_pass_mypy_strict(tmp_path: Path) -> None:
    """A typed user's copy of each docs file passes ``mypy --strict`` (the project's settings and cache: ~1 s warm):
    the fleet service read ``guard.snapshot().fleet.connected`` on a ``FleetSnapshot | None``."""
    pytest.importorskip("mypy")
    files = []
    for doc in render_docs.DOCS:
        lines = (ROOT / doc).read_text(encoding="utf-8").split("\n")
        for block in render_docs.blocks(lines, doc):
            if block.kind == "file" and block.arg.strip().endswith(".py"):
                path = tmp_path / block.arg.strip()
                path.write_text("\n".join(lines[block.start : block.end]) + "\n", encoding="utf-8")
                files.append(str(path))
    assert "service.py" in {Path(f).name for f in files}
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--no-error-summary", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert (run.returncode, run.stdout + run.stderr) == (0, "")


def test_usage_states_the_retry_after_cap_parse_retry_after_applies() -> None:
    """``parse_retry_after`` cut ``Retry-After: 86400`` to 300 s, a cap usage.md did not state."""
    from llmguard_client import RETRY_AFTER_CAP, parse_retry_after

    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    assert parse_retry_after({"Retry-After": "86400"}) == RETRY_AFTER_CAP
    assert f"`RETRY_AFTER_CAP` ({RETRY_AFTER_CAP:.0f} s" in usage
    assert f"`Retry-After: 86400` reads as {RETRY_AFTER_CAP}" in usage


@pytest.mark.parametrize("doc", [*render_docs.DOCS, "docs/compatibility.md"])
def test_the_docs_speak_to_users(doc: str) -> None:
    """No words of how the project is run: waves, numbered issues, reference seeds or sections."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert not re.findall(r"(?i)\bwaves?\b|\bissue \d|seed 00\d|§", text)


GUIDES = (
    "docs/usage.md",
    "docs/rollout.md",
    "docs/fleet.md",
    "docs/routing.md",
    "docs/loadtest.md",
    "docs/observability.md",
)
"""The user guides: what the library does and how to use it (measurements and their set-up: docs/benchmarks.md)."""


@pytest.mark.parametrize("doc", GUIDES)
def test_the_guides_name_no_internals_nor_the_machine_a_figure_came_from(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    found = re.findall(r"llmguard_client/_\w+|\btests/\w+|(?i:load average|\d-core machine|the rule before)", text)
    assert not found, f"{doc}: {found}"


USER_FILES = sorted(
    str(p.relative_to(ROOT))
    for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").glob("*.py")]
)
_FROM_IMPORT = re.compile(r"\bfrom (llmguard_\w+(?:\.\w+)*) import (\([^)]*\)|[\w ,]+)")
_IMPORT = re.compile(r"^\s*import (llmguard_\w+(?:\.\w+)*)", re.MULTILINE)


def imports_shown(text: str) -> Iterator[tuple[str, str | None]]:
    """(module, name) for each ``from llmguard_... import name``, (module, None) for ``import llmguard_...``."""
    for match in _FROM_IMPORT.finditer(text):
        for item in match[2].strip("()").split(","):
            name = item.split(" as ")[0].strip()
            if name:
                yield match[1], name
    for match in _IMPORT.finditer(text):
        yield match[1], None


def declared_all(module: str) -> list[str]:
    """The module's ``__all__`` literal, read from its source: importing a load tool's module would patch the
    standard library (Locust), and a name is public by being declared, not by being reachable."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    assert spec is not None and spec.origin is not None, f"{top} is not installed"
    base = Path(spec.origin).parent.joinpath(*rest)
    source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list | tuple), f"{module}.__all__ is not a literal list"
            return [str(name) for name in value]
    raise AssertionError(f"{module} declares no __all__")


def test_the_import_scanner_reads_every_form() -> None:
    text = "from llmguard_client import (\n    Guard,\n    Tier as T,\n)\n`from llmguard_client.x import f`; a\n"
    text += "python -c 'from llmguard_client import Guard; Guard()'\n  import llmguard_tools.sim  # a comment\n"
    assert list(imports_shown(text)) == [
        ("llmguard_client", "Guard"),
        ("llmguard_client", "Tier"),
        ("llmguard_client.x", "f"),
        ("llmguard_client", "Guard"),
        ("llmguard_tools.sim", None),
    ]


@pytest.mark.parametrize("path", USER_FILES)
def test_every_name_the_docs_import_is_public(path: str) -> None:
    """A user copies what a doc imports: only public modules, and only names their ``__all__`` declares."""
    text = (ROOT / path).read_text(encoding="utf-8")
    private = re.findall(r"llmguard_\w+\._\w+", text)
    assert not private, f"{path} names private modules: {private}"
    for module, name in imports_shown(text):
        assert not any(part.startswith("_") for part in module.split(".")), f"{module} is private"
        if name is not None:
            assert name in declared_all(module), f"{path}: {name} is not in {module}.__all__"


# --- the renderer itself, on small docs of its own --------------------------------------------------------


def write_doc(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "doc.md"
    path.write_text(body, encoding="utf-8")
    return path


DOC = """# A doc

<!-- docs-file: hello.py -->
```python
print("hello", 3 * 14)
```

<!-- docs-run: python hello.py -->
```text
```
"""


def test_render_writes_the_command_and_its_output(tmp_path: Path) -> None:
    path = write_doc(tmp_path, DOC)
    assert render_docs.process(path, check=False) == []
    assert "```text\n$ python hello.py\nhello 42\n```" in path.read_text(encoding="utf-8")
    assert render_docs.process(path, check=True) == []


def test_check_ignores_figures_but_not_words(tmp_path: Path) -> None:
    path = write_doc(tmp_path, DOC)
    render_docs.process(path, check=False)
    rendered = path.read_text(encoding="utf-8")
    path.write_text(rendered.replace("hello 42", "hello   7.5"), encoding="utf-8")
    assert render_docs.process(path, check=True) == []  # another figure, other spacing: same shape
    path.write_text(rendered.replace("hello 42", "goodbye 42"), encoding="utf-8")
    (problem,) = render_docs.process(path, check=True)
    assert "prints something else now" in problem and "+hello 42" in problem


def test_a_failing_command_is_reported(tmp_path: Path) -> None:
    path = write_doc(tmp_path, "<!-- docs-run: python -c 'raise SystemExit(3)' -->\n```text\n```\n")
    (problem,) = render_docs.process(path, check=True)
    assert "exited 3" in problem
    assert render_docs.process(path, check=False) != []
    assert path.read_text(encoding="utf-8").endswith("```text\n```\n")  # left as it was


def test_a_sample_is_checked_by_its_pattern(tmp_path: Path) -> None:
    path = write_doc(tmp_path, "<!-- docs-sample: echo verdict: HOLD ==> ^verdict: (WIDEN|HOLD) -->\n```\n```\n")
    render_docs.process(path, check=False)
    assert "$ echo verdict: HOLD\nverdict: HOLD" in path.read_text(encoding="utf-8")
    assert render_docs.process(path, check=True) == []
    path.write_text(path.read_text(encoding="utf-8").replace("==> ^verdict:", "==> ^the verdict:"), encoding="utf-8")
    (problem,) = render_docs.process(path, check=True)
    assert "matches '^the verdict:" in problem


def test_a_marker_without_a_block_is_an_error(tmp_path: Path) -> None:
    path = write_doc(tmp_path, "<!-- docs-run: echo hi -->\n\ntext\n")
    with pytest.raises(render_docs.DocError, match="must be followed at once by a ``` block"):
        render_docs.process(path, check=True)


def test_llmguard_means_this_checkout(tmp_path: Path) -> None:
    path = write_doc(
        tmp_path, "<!-- docs-run: python -c 'import llmguard_client; print(llmguard_client.__file__)' -->\n```\n```\n"
    )
    render_docs.process(path, check=False)
    assert str(ROOT / "llmguard_client" / "__init__.py") in path.read_text(encoding="utf-8")


def test_shape_masks_numbers_hex_and_spacing() -> None:
    assert render_docs.shape("TTFT p99   1.019 s  [-3.261 s, +0.00 pp]\n\n<f at 0x7fba>") == [
        "TTFT pN N s [N s, N pp]",
        "<f at N>",
    ]
