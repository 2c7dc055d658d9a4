"""One error tree for the whole store.

Every leaf also subclasses the builtin it means, so plain Python code, fsspec
and FUSE (through ``exc.errno``) understand graben's errors without knowing
them. Errors cross the wire as a ``(code, message, path)`` triple; the table
``ERRORS`` below is the one place that maps codes back to classes.
"""

from __future__ import annotations

import errno as _errno
from typing import ClassVar, cast


class GrabenError(Exception):
    """Root of every error graben raises on purpose."""

    code: ClassVar[str] = "error"
    errno_value: ClassVar[int] = _errno.EIO

    def __init__(self, message: str, path: str | None = None) -> None:
        if _is_os_error(self):
            # OSError's own fields: errno, strerror, filename (and its str()).
            OSError.__init__(cast(OSError, self), self.errno_value, message, path)
        else:
            Exception.__init__(self, message if path is None else f"{message}: {path!r}")
            # Same attribute as OSError's, so FUSE can return ``exc.errno`` for any error.
            setattr(self, "errno", self.errno_value)  # noqa: B010
        self.message = message
        self.path = path

    def __str__(self) -> str:
        # Not OSError's "[Errno 110] ...": the errno is for FUSE and errno-minded callers.
        return self.message if self.path is None else f"{self.message}: {self.path!r}"

    def __reduce__(self) -> tuple[type[GrabenError], tuple[str, str | None]]:
        # OSError pickles its errno triple; keep our (message, path) signature
        # so errors survive multiprocessing and the wire alike.
        return (type(self), (self.message, self.path))


class Refused(GrabenError):
    """A server understood the request and said no, giving its reason: no space, no
    placement, no permission, a bad argument. Never a ``ConnectionError``, never
    retried: asking again gets the same answer until someone changes the cluster."""

    code = "refused"


class NotFound(GrabenError, FileNotFoundError):
    """The path, or a directory on the way to it, does not exist."""

    code = "not_found"
    errno_value = _errno.ENOENT


class AlreadyExists(GrabenError, FileExistsError):
    """The path exists and the operation asked for it not to."""

    code = "exists"
    errno_value = _errno.EEXIST


class NotADirectory(GrabenError, NotADirectoryError):
    """A directory was needed and a file was found."""

    code = "not_a_directory"
    errno_value = _errno.ENOTDIR


class IsADirectory(GrabenError, IsADirectoryError):
    """A file was needed and a directory was found."""

    code = "is_a_directory"
    errno_value = _errno.EISDIR


class DirectoryNotEmpty(GrabenError, OSError):
    """The directory has entries and the operation needs it empty."""

    code = "not_empty"
    errno_value = _errno.ENOTEMPTY


class InvalidPath(Refused, ValueError):
    """The path is malformed: NUL byte, ``..`` escaping the root, too long."""

    code = "invalid_path"
    errno_value = errno = _errno.EINVAL


class NameTooLong(InvalidPath):
    """A name in the path is over 255 bytes, or the whole path over 64 KiB."""

    code = "name_too_long"
    errno_value = errno = _errno.ENAMETOOLONG


class InvalidArgument(Refused, ValueError):
    """An argument other than a path is out of range or malformed."""

    code = "invalid_argument"
    errno_value = errno = _errno.EINVAL


class IntegrityError(GrabenError, OSError):
    """Stored bytes do not match their checksum, or a chunk is missing."""

    code = "integrity"
    errno_value = _errno.EIO


class NoSpace(Refused, OSError):
    """A disk is full; nothing was committed."""

    code = "no_space"
    errno_value = _errno.ENOSPC


class PermissionDenied(Refused, PermissionError):
    """The caller lacks a valid token or capability for the operation."""

    code = "permission"
    errno_value = _errno.EACCES


class QuotaExceeded(Refused, OSError):
    """A write would take a directory's or a tenant's usage past its quota (bytes,
    physical bytes or files); nothing was committed, and the message names the quota."""

    code = "quota_exceeded"
    errno_value = _errno.EDQUOT


class CrossDevice(Refused, OSError):
    """A rename or hard link would move a file across a quota's boundary: copy it and
    remove the original (``mv`` does this by itself on the mount), as across filesystems."""

    code = "cross_device"
    errno_value = _errno.EXDEV


class CannotPlace(Refused, OSError):
    """Too few live data nodes to hold a chunk's copies (``min_replicas`` of them); the
    message names the dead, full or excluded nodes."""

    code = "cannot_place"
    errno_value = _errno.EHOSTDOWN


class TLSError(Refused, OSError):
    """A TLS connection could not be made: the server's certificate is not trusted, the
    server wants a client certificate, or one side speaks TLS and the other does not.
    A refusal, never retried: it holds until someone changes a certificate or a setting."""

    code = "tls"
    errno_value = _errno.EPROTO


class Unavailable(GrabenError, ConnectionError):
    """Transport: a server could not be reached or went away mid-request (or, from the
    metadata service, its database is busy). Safe requests retry it until their deadline."""

    code = "unavailable"
    errno_value = _errno.ECONNREFUSED


class Timeout(GrabenError, TimeoutError):
    """A request took longer than its deadline."""

    code = "timeout"
    errno_value = _errno.ETIMEDOUT


class ProtocolError(GrabenError, OSError):
    """A peer sent a frame that does not follow the wire protocol."""

    code = "protocol"
    errno_value = _errno.EPROTO


class MissingExtra(GrabenError, ImportError):
    """A door's optional dependencies are not installed (``import graben.fuse`` without
    pyfuse3); the message names the extra that brings them: ``pip install
    'graben[fuse]'``. Not in ``ERRORS``: it never crosses the wire."""

    code = "missing_extra"


def _is_os_error(exc: GrabenError) -> bool:
    return isinstance(exc, OSError)


ERRORS: dict[str, type[GrabenError]] = {
    cls.code: cls
    for cls in (
        GrabenError,
        NotFound,
        AlreadyExists,
        NotADirectory,
        IsADirectory,
        DirectoryNotEmpty,
        InvalidPath,
        NameTooLong,
        InvalidArgument,
        IntegrityError,
        NoSpace,
        PermissionDenied,
        Refused,
        QuotaExceeded,
        CrossDevice,
        CannotPlace,
        TLSError,
        Unavailable,
        Timeout,
        ProtocolError,
    )
}


def error_from_code(code: str, message: str, path: str | None = None) -> GrabenError:
    """Rebuild an error that crossed the wire; unknown codes become the root class."""
    return ERRORS.get(code, GrabenError)(message, path)


def from_os_error(exc: OSError, path: str | None = None) -> GrabenError:
    """Translate an ``OSError`` from local disk into the store's tree."""
    where = path or (exc.filename if isinstance(exc.filename, str) else None)
    if exc.errno in (_errno.ENOSPC, _errno.EDQUOT):
        return NoSpace(f"disk full: {exc.strerror}", where)
    if exc.errno in (_errno.EACCES, _errno.EPERM):
        return PermissionDenied(f"permission denied: {exc.strerror}", where)
    if exc.errno == _errno.ENOENT:
        return NotFound(f"not found: {exc.strerror}", where)
    return GrabenError(f"{exc.strerror or exc}", where)
