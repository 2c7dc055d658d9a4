"""Exit with pyarrow: let its threads drop our objects while Python is whole.

pyarrow wraps a ``graben://`` filesystem (``PyFileSystem(FSSpecHandler(fs))``)
and the files it opens (``PythonFile``) in C++ objects whose last reference
is often dropped on one of its own threads, after ``to_table()`` or
``read_parquet`` has returned. Dropping one takes the GIL; once Python has
begun to finalise, CPython ends a thread that asks for it with
``pthread_exit``, which C++ ``noexcept`` frames turn into ``std::terminate``
(exit 134), or the thread is left waiting for ever (a hang). So before the
interpreter tears down, the hook below waits, releasing the GIL, until the
wrappers only arrow holds are gone.
"""

from __future__ import annotations

import atexit
import gc
import sys
import time
import weakref
from typing import Any

WAIT = 3.0
"""Longest the exit waits for arrow's threads, in seconds."""
QUIET = 0.25
"""The exit goes on once nothing has been let go of for this long: what is left is
held by the program itself (a dataset in a global), which finalisation drops on
the main thread, where it is harmless."""

_filesystems: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
"""By id: a filesystem's hash needs the token fsspec gives it after ``__init__``."""
_files: weakref.WeakSet[Any] = weakref.WeakSet()


def track_filesystem(fs: Any) -> None:
    """Count ``fs`` among the filesystems pyarrow may wrap."""
    _filesystems[id(fs)] = fs


def track_file(file: Any) -> None:
    """Count ``file`` among the files pyarrow may hold."""
    _files.add(file)


def held_outside_python() -> list[weakref.ref[Any]]:
    """Our objects that only C++ (arrow) holds: arrow handlers of our filesystems,
    and open files nothing in Python refers to."""
    gc.collect()  # what only cycles kept goes now, on this thread
    found: list[Any] = []
    handler = getattr(sys.modules.get("pyarrow.fs"), "FSSpecHandler", None)
    filesystems = list(_filesystems.values())
    if handler is not None and filesystems:
        found += [r for r in gc.get_referrers(*filesystems) if isinstance(r, handler)]
    files = [f for f in list(_files) if not f.closed]
    for file in files:
        if all(r is files for r in gc.get_referrers(file)):
            found.append(file)
    return [weakref.ref(o) for o in found]


def wait_for_arrow(wait: float = WAIT, quiet: float = QUIET) -> int:
    """Release the GIL until arrow's threads have let go of our objects; how many remain."""
    if "pyarrow" not in sys.modules:
        return 0
    pending = held_outside_python()
    start = last = time.monotonic()
    while pending and (now := time.monotonic()) - start < wait and now - last < quiet:
        time.sleep(0.002)
        alive = [r for r in pending if r() is not None]
        if len(alive) < len(pending):
            last = time.monotonic()
        pending = alive
    return len(pending)


atexit.register(wait_for_arrow)
