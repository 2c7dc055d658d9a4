"""Paths: the store's, and the way to a private directory on this machine.

Store paths are validated, normalised, absolute ``/a/b`` strings, made by
pure functions, no I/O. ``..`` is resolved lexically and may not climb above
the root; NUL bytes, lone surrogates and over-long names are refused with an
``InvalidPath`` that says which rule was broken.

Local directories that must be a user's own (the dataset cache, the memory
agent's segments) are opened by ``private_dir``: the way to it walked from
``/`` a name at a time (``trusted_dir``: every directory on it its user's or
root's, and sticky where others may write; a link followed only if its
user's or root's), the directory itself made 0700 if missing, never a link,
its user's and writable by no one else (``private_child``). Whoever controls
a step on the way could otherwise point it anywhere, or plant files in it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from ._errors import (
    GrabenError,
    InvalidPath,
    NameTooLong,
    NotADirectory,
    PermissionDenied,
    from_os_error,
)

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 65_536
"""A whole path's bytes at most. Not the kernel's PATH_MAX (4,096): that bounds a path
given to one system call, not how deep a tree grows (a process that ``chdir``s down can
make paths of any length), and a mount of a sub-directory adds its own prefix. A bound all
the same, for what a request may carry."""
ROOT = "/"


def normalize(path: str) -> str:
    """Return the canonical absolute form of ``path`` or raise ``InvalidPath``."""
    return join_parts(split(path))


normalize_path = normalize
"""``normalize`` by the name ``graben.store`` exports it under."""


def split(path: str) -> tuple[str, ...]:
    """The names from the root down to ``path``; ``()`` for the root itself."""
    if not isinstance(path, str):
        raise InvalidPath(f"path must be a str, not {type(path).__name__}")
    if "\x00" in path:
        raise InvalidPath("path contains a NUL byte", path.replace("\x00", "\\0"))
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPath("path is not valid UTF-8", ascii(path)) from None
    if len(encoded) > MAX_PATH_BYTES:
        raise NameTooLong(f"path is longer than {MAX_PATH_BYTES} bytes", path[:64] + "...")
    parts: list[str] = []
    for name in path.split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            if not parts:
                raise InvalidPath("path climbs above the root with '..'", path)
            parts.pop()
            continue
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise NameTooLong(f"a name in the path is longer than {MAX_NAME_BYTES} bytes", path)
        parts.append(name)
    return tuple(parts)


def join_parts(parts: tuple[str, ...] | list[str]) -> str:
    """The absolute path of a sequence of names."""
    return "/" + "/".join(parts)


def is_within(path: str, ancestor: str) -> bool:
    """Whether normalised ``path`` is ``ancestor`` or lies below it."""
    return ancestor in (ROOT, path) or path.startswith(ancestor + "/")


# -- private local directories ---------------------------------------------------------

MAX_LINKS = 40
"""Links followed on the way to a private directory at most (as the kernel's ELOOP)."""


def private_dir(path: Path, what: str) -> int:
    """The directory ``path`` opened (its parent must exist): the way to it walked
    (``trusted_dir``), it made 0700 if missing and checked (``private_child``). Errors
    name it as ``what`` (``"the dataset cache"``) and its path."""
    path = Path(os.path.abspath(path))
    above = trusted_dir(path.parent, what)
    try:
        return private_child(path.name, above, path, what)
    finally:
        os.close(above)


def trusted_dir(path: Path, what: str) -> int:
    """``path`` (absolute) opened a component at a time from ``/``, never following a
    link blindly: every directory passed must be its user's or root's and, if others
    may write in it, sticky (else they could swap the next name); a link is followed
    only if it is its user's or root's (it sits in such a directory, so nobody else
    planted it)."""
    fd, here = _open_top()
    parts, links, name = list(path.parts[1:]), 0, ""
    try:
        _trusted_step(os.fstat(fd), here, what)
        while parts:
            name = parts.pop(0)
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                if links > MAX_LINKS or st.st_uid not in (0, os.geteuid()):
                    raise PermissionDenied(
                        f"the way to {what} goes through a link of uid {st.st_uid} "
                        "(who can change it can point it elsewhere): give a path without it",
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
            fd, here, name = step, Path(os.path.normpath(here / name)), ""
            _trusted_step(os.fstat(fd), here, what)
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError) and not isinstance(exc, GrabenError):
            raise from_os_error(exc, str(here / name)) from None
        raise
    return fd


def private_child(name: str, at: int | None, shown: Path, what: str, *, make: bool = True) -> int:
    """The directory ``name`` (relative to ``at``), made 0700 if missing (``make``),
    opened without following a link and checked: its user's, writable by no one else.
    An error names it as ``shown``."""
    if make:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=at)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=at)
    except NotADirectoryError:  # a link, with O_DIRECTORY, fails so as well
        if stat.S_ISLNK(os.lstat(name, dir_fd=at).st_mode):
            raise PermissionDenied(
                f"{what} is a symbolic link (whoever can change a link can point it "
                "elsewhere): give the directory itself",
                str(shown),
            ) from None
        raise NotADirectory(f"{what} is not a directory", str(shown)) from None
    except PermissionError as exc:
        raise PermissionDenied(f"{what} cannot be opened ({exc.strerror})", str(shown)) from None
    except OSError as exc:
        raise from_os_error(exc, str(shown)) from None
    problem = unsafe(os.fstat(fd), what)
    if problem is not None:
        os.close(fd)
        raise PermissionDenied(problem, str(shown))
    return fd


def unsafe(st: os.stat_result, what: str) -> str | None:
    """What lets another user plant or change files in ``what`` (a directory or a file
    of ours), or ``None``."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        return (
            f"{what} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}):"
            " its owner could plant files and links in it; use one of your own"
        )
    if mode & stat.S_IWOTH:
        return f"{what} is writable by others (mode {mode:o}): chmod 700 it"
    if mode & stat.S_IWGRP:
        return (
            f"{what} is writable by its group (mode {mode:o}), and it is not shared between"
            " users (a checksum catches damage, not a writer who means harm): chmod 700 it"
        )
    return None


def _open_top() -> tuple[int, Path]:
    return os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), Path("/")


def _trusted_step(st: os.stat_result, where: Path, what: str) -> None:
    """Refuse a directory on the way that someone else could rearrange."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        raise PermissionDenied(
            f"the way to {what} goes through a directory of uid {st.st_uid}: "
            "its owner could swap what is below it; use a path of your own",
            str(where),
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
        raise PermissionDenied(
            f"the way to {what} goes through a directory others may write to "
            f"(mode {mode:o}, not sticky): they could swap what is below it",
            str(where),
        )
