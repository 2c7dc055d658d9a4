"""The package layout, the public names and the dependency rules of DESIGN.md."""

from __future__ import annotations

import ast
import importlib
import pickle
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import graben.store
from graben.store import _errors

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SKIP_DIRS = {"tests", "build", "dist", ".venv", ".git", ".ci"}


def package_folders() -> set[str]:
    return {
        p.parent.name
        for p in ROOT.glob("*/__init__.py")
        if p.parent.name not in SKIP_DIRS and not p.parent.name.startswith(".")
    }


def test_every_folder_is_a_listed_package_and_vice_versa() -> None:
    setup = PYPROJECT["tool"]["setuptools"]
    listed = set(setup["packages"])
    assert listed == {f"graben.{name}" for name in package_folders()}
    assert setup["package-dir"] == {f"graben.{name}": name for name in package_folders()}


def test_no_subpackages_left_out() -> None:
    # A nested package would need its own entry in the packages list.
    nested = [p for name in package_folders() for p in (ROOT / name).glob("*/__init__.py")]
    assert nested == []


@pytest.mark.parametrize("name", sorted(package_folders()))
def test_public_names_are_exactly_all(name: str) -> None:
    module = importlib.import_module(f"graben.{name}")
    source = ast.parse((ROOT / name / "__init__.py").read_text())
    imported = {
        alias.asname or alias.name
        for node in source.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert sorted(module.__all__) == sorted(imported)
    for public in module.__all__:
        assert hasattr(module, public)


def test_modules_behind_the_door_are_private() -> None:
    for name in package_folders():
        for path in (ROOT / name).glob("*.py"):
            assert path.name == "__init__.py" or path.name.startswith("_"), path


def test_dependency_rules_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint), "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" not in result.stdout.lower().replace("0 broken", "")


def test_error_tree_covers_the_builtins() -> None:
    for cls in _errors.ERRORS.values():
        assert issubclass(cls, graben.store.GrabenError)
        exc = cls("message", "/p")
        assert exc.errno == cls.errno_value or cls is graben.store.GrabenError
        clone = pickle.loads(pickle.dumps(exc))
        assert type(clone) is cls and clone.message == "message" and clone.path == "/p"
        assert _errors.error_from_code(cls.code, "m", "/x").__class__ is cls
    assert isinstance(graben.store.NotFound("x"), FileNotFoundError)
    assert isinstance(graben.store.InvalidPath("x"), ValueError)
    assert _errors.error_from_code("no-such-code", "m").__class__ is graben.store.GrabenError
