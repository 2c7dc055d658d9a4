"""What a user gets from ``pip install graben`` without extras, and how fast ``graben`` starts.

One real, clean virtual environment per session: the project's wheel and its
base dependencies only, from the package index (no torch, pyarrow, pyfuse3,
trio). In it ``graben --help`` is quick and quiet, and each door without its
extra says which extra to install, from the command line and on import.
"""

from __future__ import annotations

import importlib.metadata
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELP_BUDGET_S = 0.5
"""``graben --help``'s budget (issue 18): the CPU time of the best of three runs (its
wall time, while the suite's other worker runs, says more of the machine than of it)."""
HEAVY = ("torch", "pyarrow", "pyfuse3", "trio", "numpy", "matplotlib", "moto", "pandas")
"""Modules that cost a second or more to import, or that a plain install lacks."""
DOORS = {
    "graben.fuse": "fuse",
    "graben.checkpoint": "checkpoint",
    "graben.dataloader": "dataset",
    "graben.bench": "bench",
}
"""Each package with an extra, and the extra's name."""
# What pip says when it cannot reach the package index: the machine lacks it.
OFFLINE = ("Could not fetch URL", "NewConnectionError", "Temporary failure in name resolution")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` directory of a fresh venv holding graben without extras."""
    where = tmp_path_factory.mktemp("install")
    wheel = _build_wheel(where)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", where / "venv"], check=True)
    python = where / "venv" / "bin" / "python"
    # This venv's pip installs into the new one: no pip of its own to bootstrap.
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(wheel)]
    done = subprocess.run(pip, capture_output=True, text=True, check=False, timeout=240)
    if done.returncode != 0 and any(word in done.stderr for word in OFFLINE):
        pytest.skip(f"the package index is unreachable: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr
    return python.parent


def _build_wheel(where: Path) -> Path:
    """The project's wheel, built from a copy (a build writes into its source tree)."""
    source = where / "source"
    skip = shutil.ignore_patterns(".*", "build", "dist", "tests", "*.egg-info", "__pycache__")
    shutil.copytree(ROOT, source, ignore=skip)
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-w", str(where / "dist"), str(source)], check=True, timeout=120)
    [wheel] = (where / "dist").glob("graben-*.whl")
    return wheel


def _run(bin_dir: Path, *args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home or bin_dir)}
    if home is not None:
        env["GRABEN_HOME"] = str(home)
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )


def _children_cpu_s() -> float:
    """CPU seconds (user and system) of this process's finished children so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


slow = pytest.mark.slow  # building the wheel and installing it takes ~5 s


@slow
def test_the_plain_install_lacks_every_extra(plain: Path) -> None:
    code = f"import importlib.util as u; print([m for m in {HEAVY!r} if u.find_spec(m)])"
    assert _run(plain, "python", "-c", code).stdout.strip() == "[]"


@slow
def test_help_is_quick_and_quiet(plain: Path) -> None:
    timings = []
    for _ in range(3):
        started = _children_cpu_s()
        done = _run(plain, "graben", "--help")
        timings.append(_children_cpu_s() - started)
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""  # no "command unavailable" warning
    assert min(timings) < HELP_BUDGET_S, timings
    listing = " ".join(done.stdout.split())
    for command in ("ls", "put", "get", "cp", "mount", "ckpt", "dataset", "bench"):
        assert f" {command} " in listing, command
    assert "pip install 'graben[fuse]'" in listing
    assert "pip install 'graben[checkpoint]'" in listing


@slow
def test_version(plain: Path) -> None:
    done = _run(plain, "graben", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"graben {importlib.metadata.version('graben')}\n"


@slow
@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["mount", "store", "mnt"], "fuse"),
        (["umount", "mnt"], "fuse"),
        (["mount", "--spool-limit", "5G", "store", "mnt"], "fuse"),
        (["ckpt", "ls", "graben:///runs"], "checkpoint"),
        (["ckpt", "export", "graben:///runs/step-1", "out.pt"], "checkpoint"),
        (["dataset", "inspect", "graben:///data"], "dataset"),
        (["bench", "--list"], "bench"),
    ],
)
def test_a_command_without_its_extra_names_it(
    plain: Path, tmp_path: Path, argv: list[str], extra: str
) -> None:
    done = _run(plain, "graben", *argv, home=tmp_path)
    assert done.returncode == 2  # a usage error: nothing ran
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr  # one line, no traceback
    assert done.stderr.startswith(f"graben {argv[0]}: ")
    assert f"pip install 'graben[{extra}]'" in done.stderr


@slow
@pytest.mark.parametrize(("package", "extra"), sorted(DOORS.items()))
def test_importing_a_door_without_its_extra_names_it(plain: Path, package: str, extra: str) -> None:
    probe = (
        "try:\n"
        f"    import {package}\n"
        "except ImportError as exc:\n"
        "    print(type(exc.__cause__).__name__, exc.__cause__.name, '|', exc)\n"
    )
    done = _run(plain, "python", "-c", probe)
    assert done.returncode == 0, done.stderr
    cause, _, message = done.stdout.partition(" | ")
    assert cause.split()[0] == "ModuleNotFoundError"  # chained from what is missing
    assert message.strip() == f"{package} needs the {extra!r} extra: pip install 'graben[{extra}]'"


@slow
def test_the_store_commands_work_without_extras(plain: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    put = subprocess.run(
        [str(plain / "graben"), "put", "-", "/a/b"],
        input="hello",
        capture_output=True,
        text=True,
        env={"GRABEN_HOME": str(home), "HOME": str(tmp_path)},
        check=False,
    )
    assert put.returncode == 0, put.stderr
    assert _run(plain, "graben", "cat", "/a/b", home=home).stdout == "hello"
    assert _run(plain, "python", "-c", "import fsspec; fsspec.filesystem('graben')").returncode == 0


# -- the development install: everything present, still nothing heavy at start-up --


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["ls", "--help"], ["ckpt", "--help"], ["mount", "--help"], ["dataset", "--help"]],
)
def test_help_imports_nothing_heavy(argv: list[str]) -> None:
    probe = (
        "import sys\n"
        "from graben.store.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as exit:\n    assert not exit.code\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}), file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "[]"
    assert "usage: graben" in done.stdout
