"""The way to the node cache's directory, walked safely.

The directory is opened a component at a time from ``/``; every directory on the
way must be its user's or root's (and sticky where others may write), a link is
followed only if its user's or root's, and the cache's own directory is made
0700 and must be a real directory of its user's, writable by no one else.
Whoever controls a step on the way could otherwise point the cache anywhere.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from graben.store import NotADirectory, PermissionDenied, cache_home


def default_dir() -> Path:
    """Where the node cache is when no ``cache_dir`` is given: ``datasets`` in the
    store's cache home (``$XDG_CACHE_HOME/graben``, else ``~/.cache/graben``)."""
    return cache_home() / "datasets"


def open_root(root: Path) -> int:
    """The cache's directory, made if missing, opened and checked, every directory and
    link on the way to it too (``_walk``)."""
    root = Path(os.path.abspath(root))
    if root == Path(os.path.abspath(default_dir())):  # ``graben`` must be ours alone too
        root.parent.parent.mkdir(parents=True, exist_ok=True)
        above = _walk(root.parent.parent)
        try:
            graben = private_dir(root.parent.name, root.parent, at=above)
        finally:
            os.close(above)
    else:
        root.parent.mkdir(parents=True, exist_ok=True)
        graben = _walk(root.parent)
    try:
        return private_dir(root.name, root, at=graben)
    finally:
        os.close(graben)


MAX_LINKS = 40
"""Links followed on the way to the cache at most (as the kernel's ELOOP)."""


def _walk(path: Path) -> int:
    """``path`` (absolute) opened a component at a time from ``/``, never following a
    link blindly: every directory passed must be its user's or root's and, if others
    may write in it, sticky (else they could swap the next name); a link is followed
    only if it is its user's or root's (it sits in such a directory, so nobody else
    planted it). Whoever controls a step could otherwise point the cache anywhere."""
    fd, here = _open_top()
    parts, links = list(path.parts[1:]), 0
    try:
        _trusted_step(os.fstat(fd), here)
        while parts:
            name = parts.pop(0)
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS or st.st_uid not in (0, os.geteuid()):
                    raise PermissionDenied(
                        f"the way to the dataset cache goes through a link of uid {st.st_uid} "
                        "(who can change it can point the cache elsewhere): give a path "
                        "without it",
                        str(here / name),
                    )
                target = Path(os.readlink(name, dir_fd=fd))
                parts = list(target.parts[1:] if target.is_absolute() else target.parts) + parts
                if target.is_absolute():
                    os.close(fd)
                    fd, here = _open_top()
                continue
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            step = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd, here = step, Path(os.path.normpath(here / name))
            _trusted_step(os.fstat(fd), here)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_top() -> tuple[int, Path]:
    return os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), Path("/")


def _trusted_step(st: os.stat_result, where: Path) -> None:
    """Refuse a directory on the way to the cache that someone else could rearrange."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        raise PermissionDenied(
            f"the way to the dataset cache goes through a directory of uid {st.st_uid}: "
            "its owner could swap what is below it; use a path of your own",
            str(where),
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        raise PermissionDenied(
            f"the way to the dataset cache goes through a directory others may write to "
            f"(mode {mode:o}, not sticky): they could swap what is below it",
            str(where),
        )


def private_dir(path: str | Path, shown: Path, at: int | None = None) -> int:
    """The directory ``path`` (relative to ``at``), made 0700 if missing, opened without
    following a link and checked; an error names it as ``shown``."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700, dir_fd=at)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
    except NotADirectoryError:  # a link, with O_DIRECTORY, fails so as well
        if stat.S_ISLNK(os.lstat(path, dir_fd=at).st_mode):
            raise PermissionDenied(_LINK, str(shown)) from None
        raise NotADirectory("the dataset cache is not a directory", str(shown)) from None
    except PermissionError as exc:
        reason = f"the dataset cache cannot be opened ({exc.strerror})"
        raise PermissionDenied(reason, str(shown)) from None
    problem = _unsafe(os.fstat(fd))
    if problem is not None:
        os.close(fd)
        raise PermissionDenied(problem, str(shown))
    return fd


_LINK = (
    "the dataset cache is a symbolic link (whoever can change a link can point it elsewhere):"
    " give the directory itself"
)


def _unsafe(st: os.stat_result) -> str | None:
    """What lets another user plant files in the directory, or ``None``."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        return (
            f"the dataset cache belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}):"
            " its owner could plant files and links in it; use a directory of your own"
        )
    if mode & stat.S_IWOTH:
        return f"the dataset cache is writable by others (mode {mode:o}): chmod 700 it"
    if mode & stat.S_IWGRP:
        return (
            f"the dataset cache is writable by its group (mode {mode:o}), and a cache is not"
            " shared between users (a crc32c catches damage, not a writer who means harm):"
            " chmod 700 it"
        )
    return None
