"""scripts/wheel_smoke.py's constraints of the minima (the script itself runs in CI, after the install)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wheel_smoke", ROOT / "scripts" / "wheel_smoke.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["wheel_smoke"] = module
    spec.loader.exec_module(module)
    return module


wheel_smoke = load_script()


def test_each_lower_bound_becomes_a_pin_of_its_release_series() -> None:
    requirements = ["httpx<1,>=0.27", "anyio>=4.4", "opentelemetry-api>=1.40", "tomli>=2.0; python_version < '3.11'"]
    assert wheel_smoke.minima(requirements) == [
        "httpx==0.27.*",
        "anyio==4.4.*",
        "opentelemetry-api==1.40.*",
        "tomli==2.0.*",
    ]


def test_a_requirement_without_a_lower_bound_cannot_be_tested_at_its_oldest() -> None:
    with pytest.raises(wheel_smoke.SmokeError, match="no lower bound"):
        wheel_smoke.minima(["httpx<1"])


def test_the_runtime_declares_a_lower_bound_for_every_dependency() -> None:
    """The oldest set is written from these: a bare name here would leave it untested."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    assert len(wheel_smoke.minima(declared)) == len(declared)


@pytest.mark.parametrize("requires_python", [">=3.10", ">= 3.10", ">=3.10.0"])
def test_the_oldest_set_runs_on_the_python_the_wheel_declares_as_its_minimum(requires_python: str) -> None:
    assert wheel_smoke.oldest_python(requires_python) == "3.10"


@pytest.mark.parametrize("requires_python", ["", "~=3.10", ">=3.10,<4", ">=3.10.2"])
def test_a_requires_python_of_another_form_names_what_is_accepted(requires_python: str) -> None:
    with pytest.raises(wheel_smoke.SmokeError, match=r"is not '>=X\.Y'"):
        wheel_smoke.oldest_python(requires_python)


def test_a_python_this_machine_does_not_have_is_not_found() -> None:
    assert wheel_smoke.find_python("3.99") is None


def test_pyenv_builds_are_ordered_by_patch_release_not_as_text() -> None:
    builds = [Path(f"/root/.pyenv/versions/3.10.{z}/bin/python3.10") for z in ("9", "13", "2")]
    assert sorted(builds, key=wheel_smoke._patch_level, reverse=True)[0].parents[1].name == "3.10.13"
