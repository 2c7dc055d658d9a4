"""One event loop on one background thread: the sync facade's engine.

Sync callers hand coroutines to ``run``; they never spin a loop per call. The
loop is per process: a forked child drops its parent's (whose thread did not
follow it into the child) without touching it, and starts its own on first use.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_state: dict[int, asyncio.AbstractEventLoop] = {}
_exiting = threading.Event()
_abandoned: list[object] = []
"""A parent's loop (and clients) as a forked child inherits them: kept, never used
nor closed, since closing would act on the parent's file descriptors."""


def _before_fork() -> None:
    _lock.acquire()  # no child inherits the lock half-way through a loop's start


def _after_fork_in_parent() -> None:
    _lock.release()


def _after_fork_in_child() -> None:
    _abandoned.extend(_state.values())
    _state.clear()
    _lock.release()  # taken by the thread that forked, the child's only one


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


def abandon(thing: object) -> None:
    """Keep ``thing`` (a parent's client, in a forked child) alive and untouched for good."""
    _abandoned.append(thing)


@atexit.register
def _stop() -> None:
    # After this, finalisers of open files must not wait on the loop: its
    # thread is a daemon and stops running while the interpreter exits.
    _exiting.set()


def adopt() -> None:
    """Make the running loop, on this thread, the process's background loop.

    For a program that runs its own asyncio loop for good (the FUSE daemon):
    clients made from now on live on it, so its coroutines await their
    ``AsyncClient`` directly, with no hand-off to another thread, while the
    sync facade, called from other threads, runs its calls there too (not from
    the loop's own thread: that raises). Before any client is made."""
    running = asyncio.get_running_loop()
    with _lock:
        found = _state.get(os.getpid())
        if found is not None and found is not running:
            raise RuntimeError("graben's background loop runs already: adopt() comes first")
        _state[os.getpid()] = running


def alive() -> bool:
    """Whether the background loop can still run work (false once Python is exiting)."""
    return not _exiting.is_set()


def loop() -> asyncio.AbstractEventLoop:
    """The process's background loop, started on first use (keyed by pid for fork)."""
    with _lock:
        found = _state.get(os.getpid())
        if found is None:
            _state.clear()
            found = _state[os.getpid()] = _start_loop()
        return found


def _start_loop() -> asyncio.AbstractEventLoop:
    """A new loop running on its own thread. On the main thread, Ctrl-C waits until
    both exist: raised half-way through the loop's constructor, it would leave an
    object whose finaliser prints a traceback at exit. (The thread inherits the
    mask, so SIGINT keeps going to the main thread, as Python expects.)"""
    main = threading.current_thread() is threading.main_thread()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if main else None
    try:
        started = asyncio.new_event_loop()
        thread = threading.Thread(target=started.run_forever, name="graben-loop", daemon=True)
        thread.start()
    finally:
        if before is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
    return started


def submit(coro: Coroutine[Any, Any, T]) -> Future[T]:
    """Schedule a coroutine on the background loop; returns a thread-safe future."""
    return asyncio.run_coroutine_threadsafe(coro, loop())


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on the background loop and wait for its result."""
    if not alive():
        coro.close()
        raise RuntimeError("graben: Python is exiting; the store can no longer be used")
    try:
        background = loop()
    except BaseException:  # Ctrl-C: the coroutine was never started, say nothing of it
        coro.close()
        raise
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is background:
        coro.close()
        raise RuntimeError("graben's sync API was called from its own event loop; use AsyncClient")
    return asyncio.run_coroutine_threadsafe(coro, background).result()
