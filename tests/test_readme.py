"""The README's code blocks run as pasted, every one of them.

- A ```python block runs in a fresh process, on a default store of its own
  (``GRABEN_HOME``), twice (a reader tries a snippet again).
- The ```sh blocks under one heading run in order as one bash session, as a reader
  types them: in a fresh temporary directory with ``GRABEN_HOME`` and ``TMPDIR``
  inside it, in a network namespace of its own (``unshare --net``, as
  ``store/scenarios/test_ports.py`` runs the default ports), where a cluster takes the
  default ports whatever this machine runs. A block that starts ``graben cluster up``
  stays in the foreground, and the README gives it a shell of its own: the session runs
  it in the background, waits for the URL it prints, and stops it at the end.
- A ``pip install`` line is checked, not run: installing would change the environment
  under test (``test_install.py`` installs the wheel into a clean venv). The extras it
  names exist, and it brings every module its section's Python blocks import.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
SESSION_TIMEOUT_S = 240
OWN_NETWORK = os.geteuid() == 0 and bool(shutil.which("unshare")) and bool(shutil.which("ip"))
NO_FUSE = not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None
FOREGROUND = "graben cluster up"
"""The one command the README leaves in the foreground of a shell of its own."""


@dataclass(frozen=True, slots=True)
class Block:
    """A fenced code block of the README."""

    section: str
    """The heading it is under."""
    language: str
    """Its fence's language."""
    code: str
    """Its text, as a reader copies it."""


def _blocks(text: str) -> list[Block]:
    blocks, section, start = [], "", 0
    for fence in FENCE.finditer(text):
        for heading in re.findall(r"^#{2,3} (.+)$", text[start : fence.start()], re.M):
            section = heading
        blocks.append(Block(section, fence.group(1), fence.group(2)))
        start = fence.end()
    return blocks


def _pip(line: str) -> list[str] | None:
    """What a ``pip install`` line installs (its options and their values left out), else
    ``None``."""
    words = shlex.split(line, comments=True)
    if words[:2] != ["pip", "install"]:
        return None
    valued = {"--index-url", "--extra-index-url", "-i", "-c", "-r"}
    return [
        w
        for i, w in enumerate(words[2:], 2)
        if not w.startswith("-") and words[i - 1] not in valued
    ]


BLOCKS = _blocks(README)
PYTHON = [b for b in BLOCKS if b.language == "python"]
SHELL = [b for b in BLOCKS if b.language == "sh"]
SESSIONS = {
    section: [b.code for b in SHELL if b.section == section]
    for section in dict.fromkeys(b.section for b in SHELL)
    if any(
        _pip(line) is None for b in SHELL if b.section == section for line in b.code.splitlines()
    )
}
"""The sections with shell blocks that do more than install."""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path: a reader's ``$TMPDIR`` is ``/tmp``-short,
    and sockets made in it must fit ``AF_UNIX``'s 108 bytes (torch's DataLoader workers
    share tensors through one; under pytest-xdist's deep ``tmp_path`` the bind failed in
    their feeder thread and the first batch never came)."""
    made = Path(tempfile.mkdtemp(prefix="readme-"))
    yield made
    shutil.rmtree(made, ignore_errors=True)


def _env(tmp_path: Path, tmp: Path) -> dict[str, str]:
    """A reader's environment: nothing of graben's set, the venv's commands first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRABEN_")}
    return {
        **env,
        "GRABEN_HOME": str(tmp_path / "home"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "TMPDIR": str(tmp),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    }


def test_the_readme_has_a_python_block_per_door() -> None:
    assert len(PYTHON) >= 4


def test_every_code_block_is_fenced_python_or_sh_so_it_runs() -> None:
    assert {b.language for b in BLOCKS} <= {"python", "sh"}
    prose = FENCE.sub("", README)
    assert not re.search(r"\n\n(    |\t)\S", prose), "an indented code block: fence it"


@pytest.mark.parametrize("code", [b.code for b in PYTHON], ids=[b.section for b in PYTHON])
def test_a_python_block_runs_as_pasted(code: str, tmp_path: Path, short_tmp: Path) -> None:
    env = {**_env(tmp_path, short_tmp), "PYTHONFAULTHANDLER": "1"}
    for _ in range(2):
        returncode, _, err = _python(code, tmp_path, env)
        assert returncode == 0, err if len(err) < 30_000 else f"{err[:20_000]}...{err[-10_000:]}"


def _python(code: str, tmp_path: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``code`` as a reader would; one that hangs is made to print where each of its
    threads (and its children's) stood (faulthandler, on SIGABRT), then killed."""
    with subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            exited = proc.poll()  # not None: a process it left holds its output open
            os.killpg(proc.pid, signal.SIGABRT)
            try:
                out, err = proc.communicate(timeout=10)
            finally:
                _kill_group(proc.pid)
            what = "hung" if exited is None else f"exited {exited} but left a process"
            return -1, out, f"{what} for 240 s; where each stood:\n{err}"
        finally:
            _kill_group(proc.pid)
        return proc.returncode, out, err


# The shell sessions.

PRELUDE = r"""set -euxo pipefail
in_the_background() {  # what a reader runs in a shell of its own
    "$@" >"$SESSION/foreground.out" 2>"$SESSION/foreground.err" &
    FOREGROUND=$!
    trap 'kill -TERM $FOREGROUND; wait $FOREGROUND' EXIT
    until grep -q '^graben://' "$SESSION/foreground.out"; do
        kill -0 $FOREGROUND || { cat "$SESSION/foreground.err" >&2; exit 1; }
        sleep 0.1
    done
}
"""


def _script(codes: list[str]) -> str:
    """The session's script: each line of the blocks, then a check of its status (``set
    -e`` lets the commands before a line's last ``&&`` fail)."""
    lines = [PRELUDE]
    for line in "\n".join(codes).splitlines():
        assert not line.endswith("\\"), "one command a line: " + line
        if _pip(line) is not None:
            line = ": checked by test_a_pip_line_names_what_exists"  # noqa: PLW2901
        elif line.startswith(FOREGROUND):
            line = f"in_the_background {line}"  # noqa: PLW2901
        lines += [line, '[ "$?" = 0 ] || exit 1']
    return "\n".join(lines) + "\n"


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    return [p for p in points if p.startswith(f"{path}/")]


def _kill_group(group: int) -> bool:
    """Kill what is left of a session's process group; whether anything was."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _leave_nothing(group: int, tmp_path: Path, daemons: list[int]) -> None:
    """What a failed session left: its processes (its own group) and its mounts (whose
    daemons run in sessions of their own, by the pids ``graben mount`` printed)."""
    _kill_group(group)
    for point in _mounts_under(tmp_path):
        subprocess.run(["fusermount3", "-u", "-z", point], check=False, capture_output=True)
    for pid in daemons:
        if not _gone(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _run(script: str, tmp_path: Path, short_tmp: Path) -> tuple[int, str, str]:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    argv = ["bash", "-c", script]
    if OWN_NETWORK:
        argv = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    env = {**_env(tmp_path, short_tmp), "SESSION": str(tmp_path)}
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out = err = ""
    try:
        out, err = proc.communicate(timeout=SESSION_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)  # its commands hold the pipes too
        out, err = proc.communicate()
        err += f"\n(the session took more than {SESSION_TIMEOUT_S} s)"
    finally:
        daemons = [int(pid) for pid in re.findall(r"daemon pid (\d+)", out)]
        left = _mounts_under(tmp_path)
        running = _kill_group(proc.pid)
        _leave_nothing(proc.pid, tmp_path, daemons)
    assert (left, running) == ([], False), f"the session left {left} mounted, processes: {running}"
    return proc.returncode, out, err


def _needs(codes: list[str]) -> list[pytest.MarkDecorator]:
    text = "\n".join(codes)
    marks = []
    if FOREGROUND in text:
        marks.append(
            pytest.mark.skipif(
                not OWN_NETWORK,
                reason="default ports: a network namespace of its own needs root, unshare, ip",
            )
        )
    if "graben mount" in text:
        marks.append(pytest.mark.skipif(NO_FUSE, reason="needs /dev/fuse and fusermount3"))
    return marks


@pytest.mark.parametrize(
    "codes", [pytest.param(c, id=s, marks=_needs(c)) for s, c in SESSIONS.items()]
)
def test_a_sections_shell_blocks_run_as_pasted(
    codes: list[str], tmp_path: Path, short_tmp: Path
) -> None:
    code, out, err = _run(_script(codes), tmp_path, short_tmp)
    assert code == 0, (out[-2000:], err[-4000:])


# What is checked rather than run.


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"": project["dependencies"], **project["optional-dependencies"]}


def _distributions(words: list[str]) -> set[str]:
    """What ``pip install WORDS`` brings from a checkout: each requirement's name, an
    extra of graben's by what it requires (the base install with it)."""
    extras, found, todo = _extras(), set(), [""]
    for word in words:
        if word == "." or word.startswith(".["):
            todo += re.findall(r"[\w-]+", word.removeprefix("."))
        else:
            found.add(re.split(r"[\[=<>~;! ]", word)[0])
    while todo:
        for requirement in extras[todo.pop()]:
            name = re.split(r"[\[=<>~;! ]", requirement)[0]
            if name == "graben":
                todo += re.findall(r"[\w-]+", requirement.split("[")[1].split("]")[0])
            else:
                found.add(name)
    return {re.sub(r"[-_.]+", "-", name).lower() for name in found}


def _modules(distributions: set[str]) -> set[str]:
    """The top-level modules of these installed distributions."""
    return {
        module
        for module, names in importlib.metadata.packages_distributions().items()
        if any(re.sub(r"[-_.]+", "-", name).lower() in distributions for name in names)
    }


PIP = [(b.section, words) for b in SHELL for line in b.code.splitlines() if (words := _pip(line))]


@pytest.mark.parametrize("words", [w for _, w in PIP], ids=[" ".join(w) for _, w in PIP])
def test_a_pip_line_names_what_exists(words: list[str]) -> None:
    """From a checkout (``.``), with extras graben has; anything else, a package this
    environment holds (so the README names it rightly)."""
    extras = _extras()
    for word in words:
        if word.startswith("."):
            assert re.fullmatch(r"\.(\[[\w,-]+\])?", word), word
            assert set(re.findall(r"[\w-]+", word)) <= extras.keys(), word
        else:
            importlib.metadata.version(word)


def test_the_install_section_says_how_to_get_torchs_cpu_build() -> None:
    """``.[all]`` with pip's default torch pulled a CUDA build of several GB."""
    install = README.split("## Install", 1)[1].split("## Quickstart")[0]
    first = next(words for section, words in PIP if section == "Install")
    assert first == ["torch"] and "download.pytorch.org/whl/cpu" in install


def test_the_readme_says_cluster_up_keeps_its_shell() -> None:
    """A reader who pasted ``graben cluster up`` and the next block in one shell waited
    forever: the README says it stays in the foreground, before the block."""
    before = README.split("### A cluster", 1)[1].split(f"```sh\n{FOREGROUND}")[0]
    assert "foreground" in before and "Ctrl-C" in before and "shell of its own" in before


def test_the_install_table_names_every_extra() -> None:
    """The README's table of extras is the one in pyproject.toml (``dev`` aside)."""
    table = set(re.findall(r"^\| `([\w-]+)` \|", README.split("## Quickstart")[0], re.M))
    assert table == _extras().keys() - {"", "dev"}


@pytest.mark.parametrize("block", PYTHON, ids=[b.section for b in PYTHON])
def test_a_section_installs_what_its_python_imports(block: Block) -> None:
    """A Python block imports only what the Install section's pip line and its own
    section's bring (pandas, say, is in no extra)."""
    sections = {"Install", block.section}
    words = [w for section, line in PIP if section in sections for w in line]
    brought = _modules(_distributions(words)) | set(sys.stdlib_module_names) | {"graben"}
    imported = set()
    for node in ast.walk(ast.parse(block.code)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported - brought == set()


def test_the_development_set_up_keeps_make_run_and_make_test() -> None:
    setup = README.split("## Set-up for development", 1)[1]
    assert "`make run`" in setup and "`make test`" in setup
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def _anchors(page: Path) -> set[str]:
    """The anchors a page's headings get (GitHub's rule: lower case, punctuation
    dropped, spaces to hyphens, a repeat numbered)."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_every_link_into_a_section_finds_it() -> None:
    """The README and docs/ link into each other's sections (docs/benchmarks.md most):
    every such anchor is a heading of the page it names."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", page.read_text()):
            if anchor not in _anchors(page.parent / target if target else page):
                broken.append(f"{page.name}: {target}#{anchor}")
    assert broken == []
