"""``CheckpointManager``: steps under one root, a ``latest`` pointer, retention.

Layout under the root URL: one DCP checkpoint per step, ``step-000000000100``
and so on, and a file ``latest`` naming the newest complete one. A step
appears only once it is complete (``GrabenWriter`` publishes it with one
rename); ``latest`` moves only after that, and old steps are removed only
after ``latest`` names the new one, so a crash at any point leaves a
loadable ``latest``.
"""

from __future__ import annotations

import builtins
import posixpath
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.planner import LoadPlanner, SavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save, save

from graben.store import Client, FileInfo, InvalidArgument, NotFound, split_url

from ._planner import GrabenLoadPlanner, GrabenSavePlanner
from ._reader import GrabenReader
from ._storage import shared_client
from ._writer import GrabenWriter

LATEST = "latest"
_STEP = re.compile(r"step-(\d{12})")
STALE_STAGING_S = 3600.0
"""Staging directories of saves that died are removed once this old."""


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """One complete checkpoint under a manager's root."""

    step: int
    """The training step it was saved at."""
    url: str
    """Its URL (what ``GrabenReader`` or ``dcp.load`` takes)."""
    mtime: float
    """When it was published, seconds since the epoch."""


@dataclass(frozen=True, slots=True)
class Retention:
    """Which checkpoints a manager keeps once a new one is durable."""

    keep_last: int | None = 3
    """The newest this many are always kept (``None``: all)."""
    keep_every: int | None = None
    """Steps that are multiples of this are kept too (long-term history)."""
    ttl: float | None = None
    """Seconds a ``keep_every`` checkpoint is kept (``None``: for ever)."""

    def doomed(self, checkpoints: list[CheckpointInfo], now: float) -> list[CheckpointInfo]:
        """Those of ``checkpoints`` (oldest first) that may go; never the newest."""
        if self.keep_last is None or not checkpoints:
            return []
        recent = checkpoints[-max(1, self.keep_last) :]
        return [c for c in checkpoints if c not in recent and not self._long_term(c, now)]

    def _long_term(self, checkpoint: CheckpointInfo, now: float) -> bool:
        if not self.keep_every or checkpoint.step % self.keep_every:
            return False
        return self.ttl is None or now - checkpoint.mtime < self.ttl


class CheckpointManager:
    """Saves and loads a training job's checkpoints under ``root_url``.

    ``CheckpointManager("graben://host:port/runs/a", keep_last=3,
    keep_every=1000, ttl=7 * 86400)``. Every rank calls ``save`` and
    ``load_latest`` (they are collective, like ``dcp.save``); only the
    coordinator (rank 0) moves ``latest`` and removes old checkpoints.
    ``compression`` is a zstd level for every save (see ``GrabenWriter``).
    """

    def __init__(
        self,
        root_url: str,
        *,
        keep_last: int | None = 3,
        keep_every: int | None = None,
        ttl: float | None = None,
        client: Client | None = None,
        replication: int | None = None,
        compression: int | None = None,
    ) -> None:
        store, root = split_url(root_url)
        self.root_url, self.root = root_url.rstrip("/"), root.rstrip("/") or "/"
        self.retention = Retention(keep_last, keep_every, ttl)
        self._client = client or shared_client(store)
        self._replication, self._compression = replication, compression
        self._stager: DefaultStager | None = None
        self._pending: Future[Any] | None = None
        self._planner = GrabenSavePlanner()  # one for every save: its plan cache

    @property
    def client(self) -> Client:
        """The store client underneath."""
        return self._client

    # -- saving -------------------------------------------------------------------

    def save(
        self,
        step: int,
        state_dict: dict[str, Any],
        *,
        async_: bool = False,
        planner: SavePlanner | None = None,
    ) -> Future[CheckpointInfo] | CheckpointInfo:
        """Save ``state_dict`` as ``step``; it becomes ``latest`` once complete.

        With ``async_``, return once the state is staged in host memory (the
        same buffers every step) and upload in the background: the returned
        future completes when the checkpoint is published. A previous
        asynchronous save is waited for first.
        """
        self.wait()
        writer = GrabenWriter(
            self.url_of(step),
            client=self._client,
            replication=self._replication,
            compression=self._compression,
        )
        if not async_:
            save(state_dict, storage_writer=writer, planner=planner or self._planner)
            return self._published(step)
        upload = async_save(
            state_dict,
            storage_writer=writer,
            planner=planner or self._planner,
            async_stager=self._staging(),
        )
        if isinstance(upload, AsyncSaveResponse):
            upload = upload.upload_completion
        done: Future[CheckpointInfo] = Future()
        upload.add_done_callback(_then(done, lambda: self._published(step)))
        self._pending = done
        return done

    def wait(self) -> None:
        """Wait for an asynchronous save still in flight (its errors are raised here)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _staging(self) -> DefaultStager:
        if self._stager is None:  # kept: its host buffers are reused every step
            self._stager = DefaultStager(StagingOptions(False, False, False, False))
        return self._stager

    def _published(self, step: int) -> CheckpointInfo:
        info = self._info(step)
        if _is_coordinator():
            self._client.put(posixpath.join(self.root, LATEST), _name(step).encode())
            self.apply_retention()
        return info

    def apply_retention(self) -> list[int]:
        """Remove what the retention rules let go (and dead saves' staging); the steps removed."""
        doomed = self.retention.doomed(self.list(), time.time())
        for checkpoint in doomed:
            self._client.rm(self._path_of(checkpoint.step), recursive=True)
        self._sweep_staging()
        return [c.step for c in doomed]

    def _sweep_staging(self) -> None:
        cutoff = time.time() - STALE_STAGING_S
        for entry in self._entries():
            stale = entry.mtime_ns / 1e9 < cutoff
            if entry.name.startswith(".step-") and ".saving-" in entry.name and stale:
                self._client.rm(entry.path, recursive=True)

    # -- loading ------------------------------------------------------------------

    def latest(self) -> CheckpointInfo | None:
        """The checkpoint ``latest`` names, or ``None`` before the first save."""
        try:
            name = self._client.get(posixpath.join(self.root, LATEST)).decode()
        except NotFound:
            return None
        match = _STEP.fullmatch(name)
        return self._info(int(match.group(1))) if match else None

    def load_latest(
        self, state_dict: dict[str, Any], *, planner: LoadPlanner | None = None
    ) -> int | None:
        """Load the latest checkpoint into ``state_dict`` in place; its step, or ``None``."""
        latest = self.latest()
        if latest is None:
            return None
        self.load(latest.step, state_dict, planner=planner)
        return latest.step

    def load(
        self, step: int, state_dict: dict[str, Any], *, planner: LoadPlanner | None = None
    ) -> None:
        """Load checkpoint ``step`` into ``state_dict`` in place."""
        reader = GrabenReader(self.url_of(step), client=self._client)
        dcp_load(state_dict, storage_reader=reader, planner=planner or GrabenLoadPlanner())

    def list(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest first."""
        found = []
        for entry in self._entries():
            match = _STEP.fullmatch(entry.name)
            if match and entry.is_dir:
                step = int(match.group(1))
                found.append(CheckpointInfo(step, self.url_of(step), entry.mtime_ns / 1e9))
        return sorted(found, key=lambda c: c.step)

    def url_of(self, step: int) -> str:
        """The URL checkpoint ``step`` has (or will have)."""
        return f"{self.root_url}/{_name(step)}"

    def close(self) -> None:
        """Wait for a pending save, then release the staging buffers (the client is shared)."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------

    def _path_of(self, step: int) -> str:
        return posixpath.join(self.root, _name(step))

    def _info(self, step: int) -> CheckpointInfo:
        stat = self._client.stat(self._path_of(step))
        return CheckpointInfo(step, self.url_of(step), stat.mtime_ns / 1e9)

    def _entries(self) -> builtins.list[FileInfo]:
        try:
            return self._client.ls(self.root)
        except NotFound:
            return []


def checkpoint_steps(entries: Iterable[FileInfo]) -> list[str]:
    """The names of the complete checkpoints among a root's entries, oldest first."""
    return sorted(e.name for e in entries if e.is_dir and _STEP.fullmatch(e.name))


def _name(step: int) -> str:
    if step < 0:
        raise InvalidArgument(f"a step is a non-negative integer, not {step}")
    return f"step-{step:012d}"


def _is_coordinator() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def _then(done: Future[Any], publish: Callable[[], Any]) -> Callable[[Future[Any]], None]:
    """A callback completing ``done`` with ``publish()`` once the upload succeeded."""

    def callback(upload: Future[Any]) -> None:
        try:
            upload.result()
            done.set_result(publish())
        except BaseException as exc:
            done.set_exception(exc)

    return callback
