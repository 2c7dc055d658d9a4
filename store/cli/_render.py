"""Output of the store's ``graben`` subcommands: text lines, JSON and progress bars.

Pure formatting, except ``emit_*`` (stdout) and ``Meter`` (stderr). Data and
reports go to stdout; progress goes to stderr, so ``--json`` and pipes see only
what they asked for.
"""

from __future__ import annotations

import itertools
import stat
import sys
import threading
import time
import unicodedata
from collections.abc import Iterable
from datetime import datetime
from types import TracebackType
from typing import Any

import msgspec
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from .._config import RESERVE, ago, env, human_size
from .._types import (
    DAMAGE,
    ChunkProblem,
    ClassState,
    Collection,
    FileInfo,
    FsckReport,
    Health,
    NodeState,
)

LARGE = 64 << 20
"""Work smaller than this finishes before a progress bar would help."""

_ESCAPES = {"\a": "a", "\b": "b", "\t": "t", "\n": "n", "\v": "v", "\f": "f", "\r": "r"}
# Not control characters, but they break a line (U+2028, U+2029) or reorder what a
# terminal shows of it (the bidirectional overrides), so a name shows them escaped too.
_UNSHOWABLE = frozenset("\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


# --- values as text -----------------------------------------------------------


def size_text(size: int, human: bool) -> str:
    """Bytes as a plain integer, or in binary units with ``human``."""
    return human_size(size) if human else str(size)


def when(mtime_ns: int) -> str:
    """A timestamp in local time, to the second (as ``ls -l`` shows it)."""
    return datetime.fromtimestamp(mtime_ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def shown(name: str) -> str:
    """A store name or path as one line of output.

    Plain names, spaces inside included, show as they are. A name with a
    control character (a newline, an escape), spaces at either end, or a
    single quote shows quoted the way GNU ``ls`` quotes for a terminal
    (``--quoting-style=shell-escape``): ``'a'$'\\n''b'``, which a shell reads
    back as the name. So one entry is always one line, and a line holds a
    ``'`` only if it was quoted.
    """
    if not _needs_quotes(name):
        return name
    if "'" in name and not any(_unshowable(c) or c in '"$`\\' for c in name):
        return f'"{name}"'  # GNU's lighter form for a quote that needs nothing more
    return "".join(_quoted(run, odd) for odd, run in itertools.groupby(name, _unshowable))


def _needs_quotes(name: str) -> bool:
    edges = name[:1].isspace() or name[-1:].isspace()
    return edges or "'" in name or any(map(_unshowable, name))


def _unshowable(c: str) -> bool:
    return unicodedata.category(c) == "Cc" or c in _UNSHOWABLE


def _quoted(run: Iterable[str], unshowable: bool) -> str:
    if not unshowable:
        return "'" + "".join(run).replace("'", "'\\''") + "'"
    return "$'" + "".join(_escape(c) for c in run) + "'"


def _escape(c: str) -> str:
    if c in _ESCAPES:
        return "\\" + _ESCAPES[c]
    return "".join(f"\\{byte:03o}" for byte in c.encode())


def mode_text(info: FileInfo) -> str:
    """``drwxr-xr-x`` / ``-rw-r--r--``."""
    kind = stat.S_IFDIR if info.is_dir else stat.S_IFREG
    return stat.filemode(kind | info.mode)


# --- command output as lines ----------------------------------------------------


def ls_lines(infos: list[FileInfo], listed: str, *, long: bool, human: bool) -> list[str]:
    """``ls`` output; ``listed`` is the normalised path asked about."""
    names = [_entry_name(info, listed) for info in infos]
    if not long:
        return names
    sizes = [size_text(info.size, human) for info in infos]
    width = max(map(len, sizes), default=0)
    return [
        f"{'dir ' if info.is_dir else 'file'}  {size:>{width}}  {when(info.mtime_ns)}  {name}"
        for info, size, name in zip(infos, sizes, names, strict=True)
    ]


def _entry_name(info: FileInfo, listed: str) -> str:
    # A file listed by its own path shows that path (as ``ls FILE`` does);
    # entries of a directory show their names, directories with a slash.
    if info.path == listed:
        return shown(info.path)
    return f"{shown(info.name)}/" if info.is_dir else shown(info.name)


def stat_lines(info: FileInfo) -> list[str]:
    """``stat`` output: one ``field  value`` line per attribute."""
    rows = [
        ("path", shown(info.path)),
        ("kind", info.kind),
        ("size", f"{info.size} ({human_size(info.size)})"),
        ("modified", when(info.mtime_ns)),
        ("mode", f"{info.mode:04o} ({mode_text(info)})"),
        ("inode", str(info.inode)),
        ("generation", str(info.generation)),
        ("replication", str(info.replication)),
    ]
    return [f"{field:<12} {value}" for field, value in rows]


def class_text(state: ClassState) -> str:
    """A path's class in words: ``ec:6+3 (set on /data; 4 of 4 chunks converted)``."""
    if not state.name:
        return "replicated (as written; no class set here or above)"
    where = f"set on {shown(state.set_on)}"
    if state.chunks:
        where += f"; {state.converted} of {state.chunks} chunks converted"
    return f"{state.name} ({where})"


def du_line(path: str, files: int, size: int, *, human: bool) -> str:
    """``du`` output: bytes, files, path (``du -s`` puts the size first too)."""
    noun = "file" if files == 1 else "files"
    return f"{size_text(size, human)}  {files} {noun}  {shown(path)}"


LEFTOVERS = {
    "orphan": "chunk files no metadata names (left by writers that stopped)",
    "unreferenced": "chunks no file uses any more",
    "temporary": "writers' leftover temporary files",
}
"""What collection removes, and what each kind is: summarised unless asked for."""


def fsck_lines(report: FsckReport, *, verbose: bool = False) -> list[str]:
    """``fsck`` output: what was checked, each damage found, leftovers counted (each one
    with ``verbose``), a verdict."""
    lines = [f"checked {report.chunks} chunks, {human_size(report.bytes)} re-read"]
    for problem in report.problems:
        if verbose or problem.kind not in LEFTOVERS:
            lines.extend(_problem_lines(problem))
    if not verbose:
        counts = _count_kinds(p for p in report.problems if p.kind in LEFTOVERS)
        for kind, n in counts.items():
            lines.append(f"{n} {kind}: {LEFTOVERS[kind]} (--verbose lists them)")
        if counts and not report.collected:
            lines.append("graben fsck --collect removes them once older than the grace period")
    state = report.collection
    if state is not None and (state.waiting or state.freed):
        lines.append(collection_line(state))
    lines.append(_verdict(report))
    return lines


def collection_line(state: Collection) -> str:
    """What waits to be collected, who collects it and when, and what was freed."""
    waiting = f"{state.waiting} chunks no file uses ({human_size(state.waiting_bytes)} on nodes)"
    if state.grace_s is None:
        when = "graben fsck --collect removes them"
    else:
        when = f"the leader collects each {state.grace_s:g} s after its last use"
    freed = f"{state.freed} chunks ({human_size(state.freed_bytes)}) freed so far"
    return f"collection: {waiting}; {when}; {freed}"


def _problem_lines(problem: ChunkProblem) -> list[str]:
    files = ", ".join(map(shown, problem.paths)) if problem.paths else "(no file)"
    lines = [f"{problem.kind:<8} {problem.chunk}", f"    at    {problem.where}"]
    lines.append(f"    files {files}")
    if problem.detail:
        lines.append(f"    why   {problem.detail}")
    return lines


def _verdict(report: FsckReport) -> str:
    counts = _count_kinds(report.problems)
    found = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "no problems"
    verdict = "OK" if report.ok else "DAMAGED"
    if set(counts) & DAMAGE == {"unreachable"}:
        verdict = "INCOMPLETE"  # nothing found wrong, but not everything checked
    collected = f"; {report.collected} collected" if report.collected else ""
    return f"{verdict}: {found}{collected}"


def _count_kinds(problems: Iterable[ChunkProblem]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for problem in problems:
        counts[problem.kind] = counts.get(problem.kind, 0) + 1
    return counts


def fsck_json(report: FsckReport) -> dict[str, Any]:
    """The report as plain data, with its ``ok`` verdict (a property the Struct does not encode)."""
    data: dict[str, Any] = msgspec.to_builtins(report)
    data["ok"] = report.ok
    return data


def status_lines(health: Health, *, cluster: bool) -> list[str]:
    """``status`` output: the store and its engine, the metadata services and which
    leads, the data nodes, a summary."""
    lines = [f"store {health.store_id}"]
    if health.engine:
        lines.append(f"engine {health.engine}")
    if cluster:
        lines.extend(_service_lines(health))
    lines.append(
        f"{'node':12} {'address':21} {'rack':10} {'state':6} {'graben':>10} {'free':>10} "
        f"{'total':>10}  scrubbed"
    )
    now = time.time()
    for node in health.nodes:
        state = "up" if node.alive else "DEAD"
        sizes = (human_size(node.stored), human_size(node.free), human_size(node.total))
        scrubbed = ago(now - node.scrubbed) if node.scrubbed else "not yet"
        lines.append(
            f"{node.id[:12]:12} {node.address:21} {node.rack:10} {state:6} "
            f"{sizes[0]:>10} {sizes[1]:>10} {sizes[2]:>10}  {scrubbed}{_leaving(node)}"
        )
    alive = sum(n.alive for n in health.nodes)
    lines.append(
        f"{alive}/{len(health.nodes)} nodes up; replication {health.replication}; "
        f"{health.degraded} chunks short of copies; {health.bad} damaged copies awaiting repair"
    )
    lines.append(collection_line(health.collection))
    if cluster and not alive:
        lines.append("no data node is alive: nothing can be read or written")
    return lines


def _leaving(node: NodeState) -> str:
    """After a node's line: a draining node's progress (``node drain``), or that its disk
    is below the reserve placement keeps (``FULL``); ``""`` in service with room."""
    if node.state == "draining":
        return f"  draining: {node.held} copies and pieces left"
    if node.state:
        return f"  {node.state}: may be stopped and removed"
    return (
        f"  FULL: under {RESERVE >> 20} MiB free, takes no new chunks"
        if node.free < RESERVE
        else ""
    )


def _service_lines(health: Health) -> list[str]:
    """One line per metadata service; the leader's says so, with its fence number."""
    lines = [f"{'service':12} {'address':21} {'state':6} role"]
    for service in health.services:
        state = "up" if service.alive else "GONE"
        role = f"leader (fence {health.fence})" if service.id == health.leader else "standby"
        lines.append(f"{service.id[:12]:12} {service.address:21} {state:6} {role}")
    if not health.leader:
        lines.append("no metadata service holds the lease now: repair waits for one")
    return lines


# --- stdout ---------------------------------------------------------------------


def emit_lines(lines: Iterable[str]) -> None:
    """Print lines to stdout, plainly (no markup: names may hold ``[`` and ``]``)."""
    for line in lines:
        sys.stdout.write(line + "\n")


def emit_json(value: object) -> None:
    """Print one JSON document to stdout, and nothing else."""
    text = msgspec.json.format(msgspec.json.encode(value), indent=2)
    sys.stdout.write(text.decode() + "\n")


# --- progress -------------------------------------------------------------------


def stderr_is_terminal() -> bool:
    """Whether a person is watching stderr (a terminal that understands escapes)."""
    return sys.stderr.isatty() and env("TERM") != "dumb"


def progress_allowed(*, json: bool = False, data_to_stdout: bool = False) -> bool:
    """Whether a command may draw a progress bar.

    Never with ``--json``, never unless stderr is a terminal, and never while
    the command's data is going to that same terminal on stdout (the bar
    would be drawn into it).
    """
    if json or not stderr_is_terminal():
        return False
    return not (data_to_stdout and sys.stdout.isatty())


class Meter:
    """A progress callback counting bytes; draws a transient bar on stderr once the work is large.

    With a known ``total`` the bar appears at once if the total exceeds
    ``LARGE``; with ``total=None`` (stdin, fsck) it appears once ``LARGE``
    bytes are done. Use it as a context manager; calling it is thread-safe
    (fsck calls it from the store's event loop thread).
    """

    def __init__(self, label: str, total: int | None, *, enabled: bool) -> None:
        self._label, self._total, self._enabled = label, total, enabled
        self._done = 0
        self._bar: Progress | None = None
        self._task = TaskID(0)
        self._lock = threading.Lock()

    def __enter__(self) -> Meter:
        with self._lock:
            self._maybe_start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._lock:
            self._enabled = False  # a late callback must not restart the bar
            if self._bar is not None:
                self._bar.stop()

    def __call__(self, nbytes: int) -> None:
        with self._lock:
            self._done += nbytes
            self._maybe_start()
            if self._bar is not None:
                self._bar.update(self._task, completed=self._done)

    @property
    def shown(self) -> bool:
        """Whether the bar has been drawn."""
        return self._bar is not None

    def _maybe_start(self) -> None:
        if self._bar is not None or not self._enabled:
            return
        large = self._done if self._total is None else self._total
        if large > LARGE:
            self._bar = _progress()
            self._task = self._bar.add_task(self._label, total=self._total, completed=self._done)
            self._bar.start()


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        # The caller checked that stderr is a terminal; say so, so that rich
        # does not second-guess it from FORCE_COLOR or TTY_COMPATIBLE.
        console=Console(stderr=True, force_terminal=True),
        transient=True,
    )
