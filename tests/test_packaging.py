"""What an installed package reads at run time ships in the wheel and is found without a checkout:
built-in suites and presets through importlib.resources, user suites before them.

(CI builds the wheel, installs it into a fresh environment and runs the commands from outside the
checkout: .ci/run.)
"""

from __future__ import annotations

import fnmatch
import os
import sys
from importlib import resources
from pathlib import Path

import pytest

from attention_zoo.presets import builtin_presets, load_sweep_preset
from attention_zoo.tasks.suite import (
    BUILTIN_SUITES,
    SUITES_ENV,
    builtin_suite,
    find_suite,
    load_task_preset,
    preset_names,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "attention_zoo"


def test_every_data_file_of_the_package_is_package_data() -> None:
    """A non-Python file inside the package ships only if a package-data glob of its package
    matches it (setuptools leaves the rest out of the wheel, and it is missing when installed)."""
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    data = [
        p
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert data, "the package holds no data files: the built-in suites and presets moved?"
    for path in data:
        package = path.parent
        while not (package / "__init__.py").exists():
            package = package.parent
        name = ".".join(package.relative_to(ROOT).parts)
        inside = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(inside, g) for g in globs.get(name, ())), (
            f"{path.relative_to(ROOT)} is not in [tool.setuptools.package-data] {name!r}"
        )


def test_every_builtin_suite_and_preset_loads_from_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./tasks: only what the package holds
    monkeypatch.delenv(SUITES_ENV, raising=False)
    shipped = sorted(
        p.name.removesuffix(".toml")
        for p in (resources.files("attention_zoo.tasks") / BUILTIN_SUITES).iterdir()
        if p.name.endswith(".toml")
    )
    assert {"duplication", "associative-recall"} <= set(shipped)
    for task in shipped:
        assert find_suite(task) == builtin_suite(task)
        for preset in preset_names(task):
            assert load_task_preset(task, preset).task.name == task
    assert {"quick", "standard", "gpu"} <= set(builtin_presets())
    for name in builtin_presets():
        assert load_sweep_preset(name).source == f"built-in preset {name}"


def test_a_user_suite_of_a_builtin_name_wins_in_search_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builtin = builtin_suite("duplication")
    assert builtin is not None
    first, second, cwd = (tmp_path / d for d in ("first", "second", "cwd"))
    for folder in (first / "sub", second, cwd / "tasks"):
        folder.mkdir(parents=True)
    text = builtin.read_text()
    (second / "duplication.toml").write_text(text)
    (cwd / "tasks" / "duplication.toml").write_text(text)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv(SUITES_ENV, os.pathsep.join([str(first), str(second)]))
    assert find_suite("duplication") == second / "duplication.toml"  # $ZOO_TASKS_DIR in order
    monkeypatch.delenv(SUITES_ENV)
    assert find_suite("duplication") == cwd / "tasks" / "duplication.toml"  # then ./tasks
    monkeypatch.chdir(tmp_path)
    assert find_suite("duplication") == builtin  # then the package's own
