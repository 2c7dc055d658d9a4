"""An agent's segments as files in one directory (``/dev/shm/graben-agent`` by default).

Layout: ``own/`` and ``peer/`` (copies kept for other hosts), each with a
directory per job named by a hash of the job's name (the name itself in its
``job`` file), holding ``STEP-RANK-of-WORLD`` files; ``.part`` while being
written. Beside each complete one, once the agent hashed the ranges its
writer named (``seal``), its ``.sum``: each range's blake3, and a tag over
them, the segment's key and size (an HMAC with a key drawn from the cluster
secret), so what is adopted after a restart is what the agent hashed, and
readers check the bytes against those sums.

Nothing here trusts the directory's other users: the directory, ``own/``,
``peer/`` and every job's directory must be the agent's user's, closed to
group and others and no link (``private_dir``: walked from ``/``; refused
otherwise, whoever made them); files are made 0600 with ``O_EXCL``, opened
relative to their directory without following a link, and checked after
opening. A restarted agent adopts the complete files whose tag verifies, and
hashes those its writer finished and the old agent had not hashed yet (their
``.ranges``, written before ``done`` was answered); it removes the rest (partial
ones: their writers went with the old agent's reservations).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import mmap
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import msgspec

from .._errors import GrabenError, PermissionDenied, from_os_error
from .._paths import private_child, private_dir
from ..transport import Held, SegmentKey

log = logging.getLogger("graben.agent")

PART = ".part"
SUM = ".sum"
RANGES = ".ranges"
"""The ranges a writer named, until the agent has hashed them (then its ``.sum``)."""
WHAT = "the memory agent's directory"
_NAME = re.compile(r"(\d{12})-(\d+)-of-(\d+)")
_JOB_DIR = re.compile(r"[0-9a-f]{24}")
_TAG_LABEL = b"graben agent segment tag v1"
Sums = list[tuple[int, int, bytes]]
"""Each range's ``(offset, length, blake3)``."""
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_SUM = 64 << 20
"""Most bytes read of a ``.sum`` or ``job`` file."""


Line = tuple[str, int, int]
"""A rank's segments: its job, rank and world size."""


class Shelf(dict[tuple[SegmentKey, bool], Held]):
    """Every segment held, by key and whether it is a peer's copy; with their bytes and
    each rank's segments kept up to date, so that neither is a pass over all of them (an
    agent holds a few segments for each of its host's ranks, and a peer's)."""

    def __init__(self) -> None:
        super().__init__()
        self.used = 0
        """Bytes of every segment held."""
        self.lines: dict[Line, dict[tuple[SegmentKey, bool], Held]] = {}

    def __setitem__(self, at: tuple[SegmentKey, bool], held: Held) -> None:
        self.pop(at, None)
        super().__setitem__(at, held)
        self.used += held.size
        self.lines.setdefault(line_of(at[0]), {})[at] = held

    def __delitem__(self, at: tuple[SegmentKey, bool]) -> None:
        self.pop(at)

    def pop(self, at: tuple[SegmentKey, bool], *default: Any) -> Any:
        if at not in self:
            return super().pop(at, *default)
        held = super().pop(at)
        self.used -= held.size
        line = self.lines[line_of(at[0])]
        del line[at]
        if not line:
            del self.lines[line_of(at[0])]
        return held

    def line(self, key: SegmentKey) -> list[Held]:
        """The segments of ``key``'s rank (its own and peers' copies)."""
        return list(self.lines.get(line_of(key), {}).values())


def line_of(key: SegmentKey) -> Line:
    return (key.job, key.rank, key.world)


class Segments:
    """The files and what is known of each (see the module docstring)."""

    def __init__(self, root: Path, secret: bytes) -> None:
        self.root = Path(os.path.abspath(root))
        self.held = Shelf()
        self.sums: dict[tuple[SegmentKey, bool], Sums] = {}
        """The sums of each sealed segment."""
        self._order = 0
        self._tag_key = hmac.new(secret, _TAG_LABEL, hashlib.sha256).digest()
        try:
            self.root.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise from_os_error(exc, str(self.root.parent)) from None
        self._fd = private_dir(self.root, WHAT)
        self._kinds: dict[bool, int] = {}
        try:
            for peer in (False, True):
                shown = self.root / _kind(peer)
                self._kinds[peer] = private_child(_kind(peer), self._fd, shown, WHAT)
                for held, sums in self._scan(peer):
                    self.held[(held.key, held.peer)] = held
                    self.sums[(held.key, held.peer)] = sums
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for fd in (*self._kinds.values(), self._fd):
            os.close(fd)
        self._kinds.clear()

    @property
    def used(self) -> int:
        """Bytes of every segment held."""
        return self.held.used

    def path(self, key: SegmentKey, peer: bool, complete: bool) -> Path:
        return self.root / _kind(peer) / _job_name(key.job) / _name(key, complete)

    def create(
        self, key: SegmentKey, size: int, peer: bool, reuse: Held | None, to_store: bool = False
    ) -> Path:
        """A file of ``size`` bytes to write ``key`` into, taking over ``reuse``'s pages."""
        name = _name(key, complete=False)
        self.forget(key, peer)
        try:
            with self._job(key.job, peer, make=True) as job:
                _unlink(name, job)  # a file of an earlier life of the agent's
                if reuse is not None:
                    del self.held[(reuse.key, reuse.peer)]
                    with self._job(reuse.key.job, reuse.peer, make=False) as old:
                        os.rename(
                            _name(reuse.key, reuse.complete), name, src_dir_fd=old, dst_dir_fd=job
                        )
                        _unlink(_name(reuse.key, True) + SUM, old)
                fd = os.open(name, _OPEN if reuse is not None else _CREATE, 0o600, dir_fd=job)
                try:
                    checked_file(os.fstat(fd), self.path(key, peer, False))
                    os.ftruncate(fd, size)
                    if size:  # every page now: a full /dev/shm is NoSpace here, not a SIGBUS
                        os.posix_fallocate(fd, 0, size)  # in the rank writing into it
                finally:
                    os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(self.path(key, peer, False))
            raise _translated(exc, self.path(key, peer, False)) from None
        self._order += 1
        self.held[(key, peer)] = Held(key, size, False, peer, to_store, self._order)
        return self.path(key, peer, False)

    def complete(self, key: SegmentKey, peer: bool) -> Held | None:
        """Mark ``key`` written (its file renamed to its final name); ``None`` if unknown."""
        held = self.held.get((key, peer))
        if held is None:
            return None
        if not held.complete:
            try:
                with self._job(key.job, peer, make=False) as job:
                    _unlink(_name(key, True) + SUM, job)
                    _unlink(_name(key, True) + RANGES, job)
                    os.rename(_name(key, False), _name(key, True), src_dir_fd=job, dst_dir_fd=job)
            except FileNotFoundError:
                self.drop(held)
                return None
            held = self.held[(key, peer)] = msgspec.structs.replace(held, complete=True)
        return held

    def hash(self, held: Held, ranges: list[tuple[int, int]]) -> Sums:
        """The blake3 of each range of ``held``'s file as it is now (the GIL let go)."""
        shown = self.path(held.key, held.peer, held.complete)
        fd = os.open(shown, _READ)
        try:
            size = checked_file(os.fstat(fd), shown).st_size
            if not size:
                return [(o, n, blake3.blake3().digest()) for o, n in ranges]
            with mmap.mmap(fd, size, prot=mmap.PROT_READ) as memory, memoryview(memory) as view:
                return [(o, n, blake3.blake3(view[o : o + n]).digest()) for o, n in ranges]
        finally:
            os.close(fd)

    def intend(self, held: Held, ranges: list[tuple[int, int]]) -> None:
        """Record the ranges complete ``held``'s writer named (its ``.ranges``), before its
        ``done`` is answered: an agent killed before it hashed them hashes them when it
        starts again, and the step is not lost."""
        with self._job(held.key.job, held.peer, make=False) as job:
            _unlink(_name(held.key, True) + RANGES, job)
            _write_new(_name(held.key, True) + RANGES, job, msgspec.msgpack.encode(ranges))

    def seal(self, held: Held, sums: Sums) -> None:
        """Record ``sums`` of complete ``held`` (its ``.sum`` beside it, tagged)."""
        final = _name(held.key, True)
        with self._job(held.key.job, held.peer, make=False) as job:
            _unlink(final + SUM, job)
            _write_new(final + SUM, job, self._sum(held.key, held.size, sums))
            _unlink(final + RANGES, job)
        self.sums[(held.key, held.peer)] = sums

    def drop(self, held: Held) -> None:
        self.held.pop((held.key, held.peer), None)
        self.sums.pop((held.key, held.peer), None)
        path = self.path(held.key, held.peer, held.complete)
        for gone in (path, path.with_name(path.name + SUM), path.with_name(path.name + RANGES)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(gone)

    def forget(self, key: SegmentKey, peer: bool) -> None:
        """Drop ``key``'s segment if there is one (before it is written again)."""
        held = self.held.get((key, peer))
        if held is not None:
            self.drop(held)

    def find(self, key: SegmentKey) -> Held | None:
        """``key``'s complete segment, a host's own before a peer's copy."""
        for peer in (False, True):
            held = self.held.get((key, peer))
            if held is not None and held.complete:
                return held
        return None

    def steps(self, job: str, rank: int, world: int) -> set[int]:
        """Steps of that rank held complete here (own or a peer's copy)."""
        return {
            h.key.step for h in self.held.lines.get((job, rank, world), {}).values() if h.complete
        }

    @contextlib.contextmanager
    def _job(self, job: str, peer: bool, make: bool) -> Iterator[int]:
        """The job's directory, opened and checked (made, and named, if ``make``)."""
        name = _job_name(job)
        fd = private_child(name, self._kinds[peer], self.root / _kind(peer) / name, WHAT, make=make)
        try:
            if make:
                with contextlib.suppress(FileExistsError):
                    _write_new("job", fd, job.encode())
            yield fd
        finally:
            os.close(fd)

    def _sum(self, key: SegmentKey, size: int, sums: Sums) -> bytes:
        encoded = msgspec.msgpack.encode(sums)
        return msgspec.msgpack.encode((encoded, self._tag(key, size, encoded)))

    def _tag(self, key: SegmentKey, size: int, sums: bytes) -> bytes:
        fields = (_TAG_LABEL, key.job, key.step, key.rank, key.world, size, sums)
        return hmac.new(self._tag_key, msgspec.msgpack.encode(fields), hashlib.sha256).digest()

    def _scan(self, peer: bool) -> Iterator[tuple[Held, Sums]]:
        """The complete segments found in ``own/`` or ``peer/`` whose tag verifies; every
        other file of theirs removed. A job directory that is not ours alone is refused."""
        kind = self._kinds[peer]
        for name in sorted(os.listdir(kind)):
            shown = self.root / _kind(peer) / name
            if not _JOB_DIR.fullmatch(name):
                log.warning("%s is no job's directory: left alone", shown)
                continue
            job_fd = private_child(name, kind, shown, WHAT, make=False)
            try:
                job = _read_small("job", job_fd)
                if job is None:
                    continue
                for file in sorted(os.listdir(job_fd)):
                    found = self._adopt(job_fd, file, job.decode(errors="replace"), peer)
                    if found is not None:
                        yield found
            finally:
                os.close(job_fd)

    def _adopt(self, job_fd: int, file: str, job: str, peer: bool) -> tuple[Held, Sums] | None:
        match = _NAME.fullmatch(file.removesuffix(PART))
        if match is None:
            return None
        if file.endswith(PART):
            _unlink(file, job_fd)
            return None
        key = SegmentKey(job, int(match[1]), int(match[2]), int(match[3]))
        shown = self.path(key, peer, True)
        try:
            fd = os.open(file, _READ, dir_fd=job_fd)
            try:
                size = checked_file(os.fstat(fd), shown).st_size
            finally:
                os.close(fd)
            held = Held(key, size, True, peer, to_store=True)
            record = _read_small(file + SUM, job_fd)
            if record is None and (named := _read_small(file + RANGES, job_fd)) is not None:
                return held, self._hashed_late(held, named)  # killed before it hashed
            sums = self._verified(record, key, size)
        except (OSError, ValueError, GrabenError) as exc:
            log.warning("%s is not adopted (%s): removed", shown, exc)
            for gone in (file, file + SUM, file + RANGES):
                _unlink(gone, job_fd)
            return None
        return held, sums

    def _hashed_late(self, held: Held, named: bytes) -> Sums:
        """The sums of a complete segment whose agent stopped before it hashed the ranges
        its writer named: hashed now (the directory is the agent's own), and sealed."""
        try:
            ranges = msgspec.msgpack.decode(named, type=list[tuple[int, int]])
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise ValueError("its ranges' record is damaged") from None
        sums = self.hash(held, ranges)
        self.seal(held, sums)
        return sums

    def _verified(self, record: bytes | None, key: SegmentKey, size: int) -> Sums:
        """The sums a ``.sum`` records, if its tag is ours for ``key`` and ``size``."""
        if record is None:
            raise ValueError("it was never hashed")
        try:
            encoded, tag = msgspec.msgpack.decode(record, type=tuple[bytes, bytes])
            if not hmac.compare_digest(tag, self._tag(key, size, encoded)):
                raise ValueError("its sums' tag does not verify: not this cluster's agent's")
            return msgspec.msgpack.decode(encoded, type=Sums)
        except msgspec.DecodeError:
            raise ValueError("its sums' record is damaged") from None


def checked_file(st: os.stat_result, shown: Path) -> os.stat_result:
    """``st`` if it is a regular file of ours that no one else may write; else
    ``PermissionDenied`` naming ``shown``."""
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        raise PermissionDenied("a segment is not a regular file", str(shown))
    if st.st_uid != os.geteuid() or mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionDenied(
            f"a segment of uid {st.st_uid}, mode {mode:o}: not the agent's own alone", str(shown)
        )
    return st


def _translated(exc: OSError, where: Path) -> GrabenError:
    return exc if isinstance(exc, GrabenError) else from_os_error(exc, str(where))


def _write_new(name: str, at: int, data: bytes) -> None:
    fd = os.open(
        name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=at
    )
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _read_small(name: str, at: int) -> bytes | None:
    """A small file of ours (``job``, a ``.sum``), never through a link; ``None`` if it
    cannot be read."""
    try:
        fd = os.open(name, _READ, dir_fd=at)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        return os.read(fd, MAX_SUM)
    finally:
        os.close(fd)


def _unlink(name: str, at: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=at)


def _name(key: SegmentKey, complete: bool) -> str:
    return f"{key.step:012d}-{key.rank}-of-{key.world}{'' if complete else PART}"


def _job_name(job: str) -> str:
    return hashlib.sha256(job.encode()).hexdigest()[:24]


def _kind(peer: bool) -> str:
    return "peer" if peer else "own"
