"""``CheckpointManager``: steps under one root, a ``latest`` pointer, retention.

Layout under the root URL: one DCP checkpoint per step, ``step-000000000100``
and so on, and a file ``latest`` naming the newest complete one. A step
appears only once it is complete (``GrabenWriter`` publishes it with one
rename); ``latest`` moves only after that, and old steps are removed only
after ``latest`` names the new one, so a crash at any point leaves a
loadable ``latest``.

With the memory tier (``tiers=("memory", "store")``), each save is first
copied into this node's memory agent (``_memory``), and every
``store_every``-th one is then written to the store from that copy, in the
background; ``load_latest`` takes the newest step complete in either.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import posixpath
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.planner import LoadPlanner, SavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save, save

from graben.store import (
    Client,
    FileInfo,
    GrabenError,
    IntegrityError,
    InvalidArgument,
    NotFound,
    check_class,
    shared_client,
    split_url,
)

from ._memory import MemoryTier
from ._planner import GrabenLoadPlanner, GrabenSavePlanner
from ._reader import GrabenReader
from ._state import Target, plain
from ._steps import LATEST, CheckpointInfo, step_name, step_of
from ._writer import GrabenWriter

STALE_STAGING_S = 3600.0
"""Staging directories of saves that died are removed once this old."""
TIERS = frozenset({"memory", "store"})
log = logging.getLogger("graben.checkpoint")


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

    Collectives run on ``process_group`` (default: the default group), except
    an asynchronous save's: its background thread gathers plans while the
    training loop runs its own collectives (DDP's all-reduce), and two threads
    on one group deadlock. So asynchronous saves run on a gloo group of the
    manager's own, made at the first one (every rank's main thread makes it,
    as every rank calls ``save``), or on ``process_group`` if given: then
    nothing else may use that group while a save is in flight.

    ``tiers=("memory", "store")`` saves into this node's memory agent first
    (``agent="HOST:PORT"``, default ``$GRABEN_AGENT``, else
    ``127.0.0.1:7300``): ``save`` blocks only while the state is copied into
    shared memory, and returns; every ``store_every``-th save (the first
    included) then goes on to the store in the background, from that copy. A
    save the agent has no room for goes to the store and says so. The memory
    tier and its collectives use a gloo group of the manager's own.

    ``archive_class="ec:6+3"`` gives each step older than the newest
    ``archive_after`` (default 1) that storage class as it is published: the
    cluster converts its chunks in the background, so old checkpoints kept for
    months cost 1.5x their bytes instead of 3x. The name is checked when the
    manager is made.
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
        process_group: dist.ProcessGroup | None = None,
        tiers: tuple[str, ...] = ("store",),
        agent: str | None = None,
        store_every: int = 1,
        archive_class: str | None = None,
        archive_after: int = 1,
    ) -> None:
        if not set(tiers) <= TIERS or "store" not in tiers or store_every < 1:
            raise InvalidArgument(
                f"tiers are ('store',) or ('memory', 'store'), not {tiers!r}; "
                f"store_every is at least 1, not {store_every}"
            )
        store, root = split_url(root_url)
        self.root_url, self.root = root_url.rstrip("/"), root.rstrip("/") or "/"
        self.retention = Retention(keep_last, keep_every, ttl)
        self._client = client or shared_client(store)
        self._replication, self._compression = replication, compression
        self._stager: DefaultStager | None = None
        self._pending: Future[Any] | None = None
        self._planner = GrabenSavePlanner()  # one for every save: its plan cache
        self._writer: GrabenWriter | None = None
        self._group, self._background = process_group, process_group
        self._tiered, self._agent, self.store_every = "memory" in tiers, agent, store_every
        self._memory: MemoryTier | None = None
        self._tier_group: dist.ProcessGroup | None = None
        self._saves = 0
        self._last_step: int | None = None
        self._flusher: ThreadPoolExecutor | None = None
        if archive_after < 1:
            raise InvalidArgument(f"archive_after is at least 1, not {archive_after}")
        self._archive = None if archive_class is None else check_class(archive_class)
        self._archive_after = archive_after
        self._archived: set[int] = set()

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

        Its values may be modules, optimizers and other ``Stateful`` objects
        (``{"model": model, "optim": optimizer}``): their state is taken now.
        With ``async_``, return once the state is staged in host memory (the
        same buffers every step) and upload in the background: the returned
        future completes when the checkpoint is published. A previous
        asynchronous save is waited for first.

        With the memory tier, the copy into memory is all a save waits for;
        its future completes at once for a save that stays in memory, else
        once the store holds it.
        """
        state_dict = plain(state_dict)
        if self._tiered:
            return self._save_tiered(step, state_dict, async_=async_, planner=planner)
        return self._save_store(step, state_dict, async_=async_, planner=planner)

    def _save_store(
        self,
        step: int,
        state_dict: dict[str, Any],
        *,
        async_: bool,
        planner: SavePlanner | None,
    ) -> Future[CheckpointInfo] | CheckpointInfo:
        self.wait()
        writer = self._writer_for(step)
        if not async_:
            save(
                state_dict,
                storage_writer=writer,
                planner=planner or self._planner,
                process_group=self._group,
            )
            return self._published(step)
        upload = async_save(
            state_dict,
            storage_writer=writer,
            planner=planner or self._planner,
            process_group=self._background_group(),
            async_stager=self._staging(),
        )
        if isinstance(upload, AsyncSaveResponse):
            upload = upload.upload_completion
        done: Future[CheckpointInfo] = Future()
        upload.add_done_callback(_then(done, lambda: self._published(step)))
        self._pending = done
        return done

    def _save_tiered(
        self,
        step: int,
        state_dict: dict[str, Any],
        *,
        async_: bool,
        planner: SavePlanner | None,
    ) -> Future[CheckpointInfo] | CheckpointInfo:
        memory = self._memory_tier()
        to_store = self._saves % self.store_every == 0
        self._saves += 1
        if to_store:
            self.wait()  # one store save at a time: the previous one is in the store first
        why = memory.stage(step, state_dict, to_store)
        if why is not None:
            log.warning("step %d goes to the store only: %s", step, why)
        if not self._everyone(why is None):
            return self._save_store(step, state_dict, async_=async_, planner=planner)
        gap = 1 if self._last_step is None else step - self._last_step
        memory.done(step, gap, self._saves % self.store_every == 0)
        self._last_step = step
        if not to_store:
            info = CheckpointInfo(step, self.url_of(step), time.time(), ("memory",))
            return _done(info) if async_ else info
        views = memory.views(step)
        if self._flusher is None:
            self._flusher = ThreadPoolExecutor(1, thread_name_prefix="graben-ckpt-store")
        writer, group = self._writer_for(step), self._background_group()

        def flush() -> CheckpointInfo:
            save(
                views, storage_writer=writer, planner=planner or self._planner, process_group=group
            )
            return dataclasses.replace(self._published(step), tiers=("memory", "store"))

        self._pending = self._flusher.submit(flush)
        return self._pending if async_ else self._pending.result()

    def _memory_tier(self) -> MemoryTier:
        if self._memory is None:
            rank, world = _rank_world(self._group)
            self._memory = MemoryTier(self.root_url, self._agent, rank, world)
        return self._memory

    def _everyone(self, yes: bool) -> bool:
        """Whether ``yes`` holds on every rank (a collective on the memory tier's group)."""
        if not (dist.is_available() and dist.is_initialized()):
            return yes
        flag = torch.tensor([int(yes)])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._tiers_group())
        return bool(flag.item())

    def _tiers_group(self) -> dist.ProcessGroup:
        """The memory tier's gloo group (made by every rank at its first use, as all
        ranks save and load together)."""
        if self._tier_group is None:
            self._tier_group = dist.new_group(backend="gloo")
        return self._tier_group

    def _writer_for(self, step: int) -> GrabenWriter:
        """One writer for every save: it keeps the last one's metadata to reuse."""
        if self._writer is None:
            self._writer = GrabenWriter(
                self.url_of(step),
                client=self._client,
                replication=self._replication,
                compression=self._compression,
            )
        else:
            self._writer.reset(self.url_of(step))
        return self._writer

    def _background_group(self) -> dist.ProcessGroup | None:
        """The group asynchronous saves gather on: never the one the training loop uses."""
        if self._background is None and dist.is_available() and dist.is_initialized():
            self._background = dist.new_group(backend="gloo")
        return self._background

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
        if _is_coordinator(self._group):
            self._client.put(posixpath.join(self.root, LATEST), step_name(step).encode())
            self.apply_retention()
        if self._memory is not None:
            self._memory.stored(step)
        return info

    def apply_retention(self) -> list[int]:
        """Remove what the retention rules let go (and dead saves' staging); the steps removed."""
        kept = self.list()
        doomed = self.retention.doomed(kept, time.time())
        for checkpoint in doomed:
            self._client.rm(self._path_of(checkpoint.step), recursive=True)
        self._sweep_staging()
        if self._archive is not None:
            self._archive_old([c for c in kept if c not in doomed])
        return [c.step for c in doomed]

    def _archive_old(self, kept: list[CheckpointInfo]) -> None:
        """Give the archive class to the steps past the newest ``archive_after`` (once each:
        a class set is one metadata write)."""
        assert self._archive is not None
        for checkpoint in kept[: -self._archive_after]:
            if checkpoint.step not in self._archived:
                self._client.set_class(self._path_of(checkpoint.step), self._archive)
                self._archived.add(checkpoint.step)

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
        step = step_of(name)
        return self._info(step) if step is not None else None

    def load_latest(
        self, state_dict: dict[str, Any], *, planner: LoadPlanner | None = None
    ) -> int | None:
        """Load the latest checkpoint into ``state_dict`` in place; its step, or ``None``.

        Its modules, optimizers and Statefuls get their state back; an optimizer's
        plain state dict that cannot take the saved state is refused (``InvalidArgument``).
        With the memory tier: the newest step complete in memory on every rank
        (at this node's agent or its peer), unless the store holds a newer one. A
        step that some rank cannot load from memory (its segment differs from the
        digest its writer gave, or is gone) is refused on every rank, with a
        warning, and the next newest is tried, then the store's; if none is left,
        the refusal is raised (the state dict may hold refused bytes by then).
        """
        latest, target = self.latest(), Target(state_dict)
        refused: GrabenError | None = None
        if self._tiered:
            for step in self._memory_steps():
                if latest is not None and step < latest.step:
                    break
                why = self._memory_load(step, target)
                if self._everyone(why is None):
                    return target.restored(step)
                elsewhere = IntegrityError(f"another rank refused step {step} in memory")
                refused = why or refused or elsewhere
        if latest is None:
            if refused is not None:
                raise refused
            return None
        return self._load(latest.step, target, planner)

    def _memory_load(self, step: int, target: Target) -> GrabenError | None:
        """Load ``step`` from memory on this rank; ``None`` if it did, else why not."""
        try:
            self._memory_tier().load(step, target)
        except GrabenError as exc:
            log.warning("step %d is not loaded from memory: %s", step, exc)
            return exc
        return None

    def load(
        self, step: int, state_dict: dict[str, Any], *, planner: LoadPlanner | None = None
    ) -> None:
        """Load checkpoint ``step`` into ``state_dict`` in place (as ``load_latest``)."""
        self._load(step, Target(state_dict), planner)

    def _load(self, step: int, target: Target, planner: LoadPlanner | None) -> int:
        reader = GrabenReader(self.url_of(step), client=self._client)
        target.check(reader.read_metadata().state_dict_metadata)
        planner = planner or GrabenLoadPlanner()
        dcp_load(target.plain, storage_reader=reader, planner=planner, process_group=self._group)
        return target.restored(step)

    def _memory_steps(self) -> builtins.list[int]:
        """The steps every rank can load from memory (a collective), newest first."""
        mine = set(self._memory_tier().steps())
        if dist.is_available() and dist.is_initialized():
            everyone: builtins.list[set[int] | None] = [None] * dist.get_world_size(self._group)
            dist.all_gather_object(everyone, mine, group=self._tiers_group())
            for theirs in everyone:
                mine &= theirs or set()
        return sorted(mine, reverse=True)

    def list(self) -> list[CheckpointInfo]:
        """Complete checkpoints, oldest first."""
        found = []
        for entry in self._entries():
            step = step_of(entry.name)
            if step is not None and entry.is_dir:
                found.append(CheckpointInfo(step, self.url_of(step), entry.mtime_ns / 1e9))
        return sorted(found, key=lambda c: c.step)

    def url_of(self, step: int) -> str:
        """The URL checkpoint ``step`` has (or will have)."""
        return f"{self.root_url}/{step_name(step)}"

    def close(self) -> None:
        """Wait for a pending save, then release the staging buffers (the client is shared)."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None
            if self._flusher is not None:
                self._flusher.shutdown()
                self._flusher = None
            if self._memory is not None:
                self._memory.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------

    def _path_of(self, step: int) -> str:
        return posixpath.join(self.root, step_name(step))

    def _info(self, step: int) -> CheckpointInfo:
        stat = self._client.stat(self._path_of(step))
        return CheckpointInfo(step, self.url_of(step), stat.mtime_ns / 1e9)

    def _entries(self) -> builtins.list[FileInfo]:
        try:
            return self._client.ls(self.root)
        except NotFound:
            return []


def _is_coordinator(group: dist.ProcessGroup | None) -> bool:
    """Whether this process is rank 0 of ``group`` (DCP's coordinator), or alone."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank(group) == 0


def _rank_world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _done(info: CheckpointInfo) -> Future[CheckpointInfo]:
    done: Future[CheckpointInfo] = Future()
    done.set_result(info)
    return done


def _then(done: Future[Any], publish: Callable[[], Any]) -> Callable[[Future[Any]], None]:
    """A callback completing ``done`` with ``publish()`` once the upload succeeded."""

    def callback(upload: Future[Any]) -> None:
        try:
            upload.result()
            done.set_result(publish())
        except BaseException as exc:
            done.set_exception(exc)

    return callback
