"""The package layout, the public names and the dependency rules of docs/architecture.md."""

from __future__ import annotations

import ast
import builtins
import importlib
import pickle
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import grimp
import pytest

import graben.store
from graben.store import _errors

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SKIP_DIRS = {"tests", "build", "dist", ".venv", ".git", ".ci"}


def package_folders() -> set[str]:
    """Every package folder, nested ones too, as paths from the root (``store/wire``)."""
    tops = [
        p.parent
        for p in ROOT.glob("*/__init__.py")
        if p.parent.name not in SKIP_DIRS and not p.parent.name.startswith(".")
    ]
    return {p.parent.relative_to(ROOT).as_posix() for top in tops for p in top.rglob("__init__.py")}


def package_name(folder: str) -> str:
    return "graben." + folder.replace("/", ".")


def test_every_folder_is_a_listed_package_and_vice_versa() -> None:
    setup = PYPROJECT["tool"]["setuptools"]
    listed = set(setup["packages"])
    assert listed == {package_name(folder) for folder in package_folders()}
    assert setup["package-dir"] == {package_name(folder): folder for folder in package_folders()}


def test_no_subpackages_left_out() -> None:
    # A folder of modules without __init__.py would be a namespace package: the
    # editable install imports it, the wheel leaves it out.
    packages = package_folders()
    for folder in {f.split("/")[0] for f in packages}:
        for module in (ROOT / folder).rglob("*.py"):
            assert module.parent.relative_to(ROOT).as_posix() in packages, module


@pytest.mark.parametrize("folder", sorted(package_folders()))
def test_public_names_are_exactly_all(folder: str) -> None:
    module = importlib.import_module(package_name(folder))
    source = ast.parse((ROOT / folder / "__init__.py").read_text())
    # A door whose extra is optional imports its names lazily: under TYPE_CHECKING.
    body = [*source.body, *(n for b in source.body if isinstance(b, ast.If) for n in b.body)]
    imported = {
        alias.asname or alias.name
        for node in body
        if isinstance(node, ast.ImportFrom) and node.level > 0  # from its own modules
        for alias in node.names
    }
    assert sorted(module.__all__) == sorted(imported)
    for public in module.__all__:
        assert hasattr(module, public)


def test_modules_behind_the_door_are_private() -> None:
    for folder in package_folders():
        if Path(folder).name.startswith("_"):
            continue  # a private package: its modules are behind the parent's door
        for path in (ROOT / folder).glob("*.py"):
            assert path.name == "__init__.py" or path.name.startswith("_"), path


def test_the_store_top_holds_only_its_shared_modules() -> None:
    # Everything else is in a layer's folder (docs/architecture.md).
    assert len(list((ROOT / "store").glob("*.py"))) <= 9


def test_no_module_over_500_lines_unless_it_says_why() -> None:
    folders = [f for f in ROOT.iterdir() if f.is_dir() and not f.name.startswith(".")]
    ours = [f for f in folders if f.name == "tests" or f.name not in SKIP_DIRS]
    for path in (p for folder in ours for p in folder.rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > 500:
            assert "500 lines" in (ast.get_docstring(ast.parse(text)) or ""), path


def test_no_import_cycles() -> None:
    graph = grimp.build_graph("graben", include_external_packages=False)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert [c for c in _strongly_connected(imports) if len(c) > 1] == []


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components: each one of two or more modules is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            found.append(component)

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


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


DOORS = ("checkpoint", "dataloader", "fuse")
PROTOCOL_RAISES: dict[str, tuple[str, ...]] = {
    # What a door raises because a protocol it implements says so, and where.
    "KeyError": ("checkpoint/_ranked.py",),  # Mapping.__getitem__ of a missing key
    "IndexError": ("dataloader/_map.py",),  # a map-style Dataset past its end
    "NotImplementedError": ("dataloader/_shards.py",),  # an abstract method
    # argparse shows only this error's words as a usage error (type= callables)
    "argparse.ArgumentTypeError": ("dataloader/_cli.py", "fuse/_cli.py"),
    # a FUSE op answers the kernel with an errno
    "pyfuse3.FUSEError": ("fuse/_base.py", "fuse/_handles.py", "fuse/_ops.py"),
    "SystemExit": ("fuse/__main__.py",),  # ``python -m graben.fuse``'s exit status
}


def _raises(path: Path) -> list[tuple[int, str, bool]]:
    """Each ``raise`` in ``path``: its line, what it names, and whether it calls it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            called = isinstance(node.exc, ast.Call)
            named = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            found.append((node.lineno, ast.unparse(named), called))
    return found


def _resolved(module: ModuleType, dotted: str) -> object:
    """What ``dotted`` names in ``module`` (its globals, then the builtins); None if nothing."""
    first, *rest = dotted.split(".")
    value = vars(module).get(first, getattr(builtins, first, None))
    for part in rest:
        value = getattr(value, part, None)
    return value


@pytest.mark.parametrize("door", DOORS)
def test_doors_raise_the_stores_errors(door: str) -> None:
    """A door raises a ``GrabenError`` on purpose; a builtin only where a protocol says so."""
    wrong = []
    for path in sorted((ROOT / door).rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        for line, named, called in _raises(path):
            if where in PROTOCOL_RAISES.get(named, ()):
                continue
            module = importlib.import_module(package_name(where.removesuffix(".py")))
            raised = _resolved(module, named)
            if not isinstance(raised, type) and not called:
                continue  # a caught exception raised again (``raise exc``)
            if not (isinstance(raised, type) and issubclass(raised, graben.store.GrabenError)):
                wrong.append(f"{where}:{line}: {named}")
    assert wrong == []


def test_every_module_is_named_in_the_architecture() -> None:
    """docs/architecture.md is the design: each module of every package is in its tree."""
    arch = (ROOT / "docs" / "architecture.md").read_text()
    unnamed = [
        str(path.relative_to(ROOT))
        for folder in ("store", "fuse", "checkpoint", "dataloader", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "__init__.py" and path.name not in arch
    ]
    assert unnamed == []


def test_every_path_the_docs_name_exists() -> None:
    """The repository stands alone: what its pages point at is in it."""
    named = re.compile(r"`((?:store|fuse|checkpoint|dataloader|bench|tests|docs)/[\w./-]+)`")
    linked = re.compile(r"\]\(((?!https?:|#)[^)#\s]+)")
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for path in named.findall(text):
            if not (ROOT / path.rstrip("/")).exists():
                missing.append(f"{page.name}: {path}")
        for link in linked.findall(text):
            if not (page.parent / link).exists():
                missing.append(f"{page.name}: ({link})")
    assert missing == []


DOORS = ("checkpoint", "dataloader", "fuse")
"""The packages beside the store that users reach it through."""


def test_the_environment_is_read_in_the_store_config_alone() -> None:
    """What graben takes from the environment is in one module, with its precedence."""
    readers = [
        str(path.relative_to(ROOT))
        for top in ("store", *DOORS)
        for path in sorted((ROOT / top).rglob("*.py"))
        if re.search(r"os\.environ|getenv", path.read_text())
    ]
    assert readers == ["store/_config/_env.py"]


PROCESS_RECORDS = {
    "fuse/_mount.py:_daemons",
    "store/fsspec/_exit.py:_filesystems",
    "store/fsspec/_exit.py:_files",
    "dataloader/_s3.py:_started_in",
}
"""Module state kept on purpose, of the process itself: the daemons it started are its
children (as ``subprocess`` keeps its own), which ``unmount`` waits for; the exit hook
that outwaits pyarrow's threads holds weak references to what they may hold; obstore's
threads run in the process that first fetched, so a fork of it must not use them."""
MUTABLE = {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakSet", "WeakValueDictionary"}


def test_the_doors_keep_no_state_in_their_modules() -> None:
    """A door's memory (clients, earlier saves) belongs to an object its caller owns;
    upper-case names are constants."""
    found = []
    for top in (*DOORS, "store/fsspec"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names = [t.id for t in targets if isinstance(t, ast.Name)]
                    value = node.value
                    call = value.func if isinstance(value, ast.Call) else None
                    called = getattr(call, "attr", getattr(call, "id", ""))
                    mutable = isinstance(value, ast.Dict | ast.List | ast.Set) or called in MUTABLE
                    for name in names:
                        where = f"{path.relative_to(ROOT)}:{name}"
                        if mutable and not name.isupper() and name != "__all__":
                            found.append(where)
    assert sorted(set(found) - PROCESS_RECORDS) == []
