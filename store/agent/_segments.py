"""An agent's segments as files in one directory (``/dev/shm/graben-agent`` by default).

Layout: ``own/`` and ``peer/`` (copies kept for other hosts), each with a
directory per job named by a hash of the job's name (the name itself in its
``job`` file), holding ``STEP-RANK-of-WORLD`` files; ``.part`` while being
written. A restarted agent adopts the complete files it finds and removes
the partial ones (their writers went with the old agent's reservations).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec

from .._errors import from_os_error
from ..transport import Held, SegmentKey

log = logging.getLogger("graben.agent")

PART = ".part"
_NAME = re.compile(r"(\d{12})-(\d+)-of-(\d+)")


class Segments:
    """The files and what is known of each (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.held: dict[tuple[SegmentKey, bool], Held] = {}
        self._order = 0
        for peer in (False, True):
            try:
                (root / _kind(peer)).mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise from_os_error(exc, str(root / _kind(peer))) from None
            for held in self._scan(peer):
                self.held[(held.key, held.peer)] = held

    @property
    def used(self) -> int:
        """Bytes of every segment held."""
        return sum(h.size for h in self.held.values())

    def path(self, key: SegmentKey, peer: bool, complete: bool) -> Path:
        name = f"{key.step:012d}-{key.rank}-of-{key.world}{'' if complete else PART}"
        return self._job_dir(key.job, peer) / name

    def create(
        self, key: SegmentKey, size: int, peer: bool, reuse: Held | None, to_store: bool = False
    ) -> Path:
        """A file of ``size`` bytes to write ``key`` into, taking over ``reuse``'s pages."""
        target = self.path(key, peer, complete=False)
        self.forget(key, peer)
        try:
            job = self._job_dir(key.job, peer)
            if not job.is_dir():  # once per job, not on every save's path
                job.mkdir(mode=0o700)
                (job / "job").write_text(key.job)
            if reuse is not None:
                del self.held[(reuse.key, reuse.peer)]
                os.rename(self.path(reuse.key, reuse.peer, reuse.complete), target)
            with open(target, "ab") as f:
                os.ftruncate(f.fileno(), size)
                if size:  # every page now: a full /dev/shm is NoSpace here, not a SIGBUS
                    os.posix_fallocate(f.fileno(), 0, size)  # in the rank writing into it
        except OSError as exc:
            target.unlink(missing_ok=True)
            raise from_os_error(exc, str(target)) from None
        self._order += 1
        self.held[(key, peer)] = Held(key, size, False, peer, to_store, self._order)
        return target

    def complete(self, key: SegmentKey, peer: bool) -> Held | None:
        """Mark ``key`` written (its file renamed to its final name); ``None`` if unknown."""
        held = self.held.get((key, peer))
        if held is None:
            return None
        if not held.complete:
            try:
                os.rename(self.path(key, peer, False), self.path(key, peer, True))
            except FileNotFoundError:
                del self.held[(key, peer)]
                return None
            held = self.held[(key, peer)] = msgspec.structs.replace(held, complete=True)
        return held

    def drop(self, held: Held) -> None:
        self.held.pop((held.key, held.peer), None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(held.key, held.peer, held.complete))

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
            h.key.step
            for h in self.held.values()
            if h.complete and (h.key.job, h.key.rank, h.key.world) == (job, rank, world)
        }

    def _job_dir(self, job: str, peer: bool) -> Path:
        return self.root / _kind(peer) / hashlib.sha256(job.encode()).hexdigest()[:24]

    def _scan(self, peer: bool) -> Iterator[Held]:
        for job_dir in (self.root / _kind(peer)).iterdir():
            try:
                job = (job_dir / "job").read_text()
            except OSError:
                continue
            for file in job_dir.iterdir():
                match = _NAME.fullmatch(file.name.removesuffix(PART))
                if match is None:
                    continue
                if file.name.endswith(PART):
                    file.unlink(missing_ok=True)
                    continue
                key = SegmentKey(job, int(match[1]), int(match[2]), int(match[3]))
                yield Held(key, file.stat().st_size, True, peer, to_store=True)


def _kind(peer: bool) -> str:
    return "peer" if peer else "own"
