"""Store paths: validated, normalised, absolute ``/a/b`` strings.

Pure functions, no I/O. ``..`` is resolved lexically and may not climb above
the root; NUL bytes, lone surrogates and over-long names are refused with an
``InvalidPath`` that says which rule was broken.
"""

from __future__ import annotations

from ._errors import InvalidPath, NameTooLong

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
