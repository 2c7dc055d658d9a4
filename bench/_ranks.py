"""A thousand ranks saving and loading one checkpoint at once, through GrabenWriter and
GrabenReader, spread over a few processes.

Each worker process hosts a block of ranks, each with a ``Client`` of its own (its
own connections to the metadata service and the data nodes; the clients of one
process share its event loop thread, as every ``Client`` does) and a thread of its
own. A rank holds one 64 KiB tensor of its own (``shard.<rank>``) and goes through
the calls ``dcp.save`` makes on a rank, in DCP's order: ``set_up_planner``,
``create_local_plan``, ``prepare_local_plan``; then, with the coordinator's plan,
``finish_plan`` and ``write_data``. This process is the coordinator: it gathers the
plans, makes the global plan (``create_global_plan``, ``prepare_global_plan``),
hands each rank its part, gathers the results and publishes the checkpoint
(``finish``). The collectives are pipes between processes; nothing else is
simulated. Loading: every rank reads the checkpoint's metadata as
``GrabenLoadPlanner`` asks, then its own tensor, and checks every byte.

Timed: from the moment the ranks are told to write (their first byte) to the
published checkpoint; and from the moment they are told to load until every rank
has its tensor back and checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter

from graben.checkpoint import GrabenLoadPlanner, GrabenReader, GrabenWriter
from graben.store import Client
from graben.store._config import endpoints
from graben.store.cli._cluster import raise_open_files

SHARD_BYTES = 64 * 1024
"""Bytes of the tensor each rank saves."""


@dataclass(frozen=True)
class Outcome:
    """What a thousand-rank save and load measured."""

    ranks: int
    processes: int
    publish_s: float
    """From the ranks' first byte to the published checkpoint."""
    load_s: float
    """From the ranks told to load to every rank holding its tensor, checked."""
    connections: dict[str, int]
    """Established client connections each server held after the save (by address)."""
    seed: int
    """What the published checkpoint's tensors were made from (``shard(rank, seed)``)."""
    cpu_s: float = 0.0
    """CPU time (user + system) the timed save cost every process of this machine's tree
    under the bench: ranks, coordinator, metadata services, data nodes."""


def shard(rank: int, seed: int) -> torch.Tensor:
    """Rank ``rank``'s tensor for save ``seed``: its own bytes, the same every time."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    return torch.randint(-(2**31), 2**31 - 1, (SHARD_BYTES // 4,), dtype=torch.int32, generator=gen)


def _key(rank: int) -> str:
    return f"shard.{rank}"


@dataclass(frozen=True)
class Storage:
    """Where the ranks save: a graben cluster (``store``: its URL; ``checkpoint``: a path
    in it) or DCP's own FileSystemWriter/Reader (``store`` empty; ``checkpoint``: a
    directory)."""

    store: str
    checkpoint: str
    replication: int | None = None
    """Copies of each chunk on graben (``None``: the cluster's default)."""

    def at(self, suffix: str) -> Storage:
        """The same storage, another checkpoint beside this one."""
        return dataclasses.replace(self, checkpoint=self.checkpoint + suffix)

    def client(self) -> Client | None:
        return Client(self.store) if self.store else None

    def writer(self, client: Client | None) -> Any:
        if client is None:
            return FileSystemWriter(self.checkpoint)
        return GrabenWriter(self.checkpoint, client=client, replication=self.replication)

    def reader(self, client: Client | None) -> tuple[Any, Any]:
        """A reader and the load planner that goes with it."""
        if client is None:
            return FileSystemReader(self.checkpoint), DefaultLoadPlanner()
        return GrabenReader(self.checkpoint, client=client), GrabenLoadPlanner()


class _Ranks:
    """A worker process's ranks: a client, a writer's and a planner's state each."""

    def __init__(self, storage: Storage, ranks: range) -> None:
        self.ranks = ranks
        self.clients = [storage.client() for _ in ranks]
        self.threads = ThreadPoolExecutor(len(ranks), thread_name_prefix="rank")
        self.writers: list[Any] = []
        self.planners: list[Any] = []

    def each(self, fn: Any, *per_rank: list[Any]) -> list[Any]:
        """``fn(i, ...)`` for every rank at once, each on its own thread; in rank order."""
        args = per_rank or ([None] * len(self.ranks),)
        return list(self.threads.map(fn, range(len(self.ranks)), *args))

    def plan(self, storage: Storage, seed: int) -> list[Any]:
        self.writers = [storage.writer(c) for c in self.clients]
        self.planners = [DefaultSavePlanner() for _ in self.ranks]

        def local(i: int, _: None) -> Any:
            writer, planner = self.writers[i], self.planners[i]
            writer.set_up_storage_writer(False)
            state = {_key(self.ranks[i]): shard(self.ranks[i], seed)}
            planner.set_up_planner(state, writer.storage_meta(), False)
            return writer.prepare_local_plan(planner.create_local_plan())

        return self.each(local)

    def write(self, plans: list[Any]) -> list[Any]:
        def write(i: int, plan: Any) -> Any:
            planner = self.planners[i]
            return self.writers[i].write_data(planner.finish_plan(plan), planner).wait()

        return self.each(write, plans)

    def load(self, storage: Storage, seed: int) -> list[str]:
        """Each rank's tensor loaded; what differs from what was saved (nothing, if right)."""

        def load(i: int, _: None) -> str:
            rank = self.ranks[i]
            want = shard(rank, seed)
            state = {_key(rank): torch.zeros_like(want)}
            reader, planner = storage.reader(self.clients[i])
            metadata = reader.read_metadata()
            reader.set_up_storage_reader(metadata, False)
            planner.set_up_planner(state, metadata, False)
            plan = reader.prepare_local_plan(planner.create_local_plan())
            reader.read_data(planner.finish_plan(plan), planner).wait()
            return "" if torch.equal(state[_key(rank)], want) else f"rank {rank}: bytes differ"

        return [wrong for wrong in self.each(load) if wrong]

    def close(self) -> None:
        self.threads.shutdown()
        for client in self.clients:
            if client is not None:
                client.close()


def _worker(
    conn: multiprocessing.connection.Connection, host: Callable[[range], Any], ranks: range
) -> None:
    """A worker process: its ranks (``host(ranks)``) do what the coordinator says until
    told to stop."""
    raise_open_files()
    hosted = host(ranks)
    try:
        conn.send("ready")
        while True:
            what, *args = conn.recv()
            if what == "stop":
                return
            conn.send(getattr(hosted, what)(*args))
    except BaseException as exc:  # the coordinator must hear of it, not wait forever
        conn.send(exc)
        raise
    finally:
        hosted.close()


class Workers:
    """The worker processes, and the collectives between them and the coordinator.

    Each hosts a block of the ranks: ``host(block)`` (picklable: a class, or a
    ``functools.partial`` of one), whose methods ``tell`` and ``scatter`` call by name
    and which has a ``close``."""

    def __init__(self, host: Callable[[range], Any], ranks: int, processes: int) -> None:
        spawn = multiprocessing.get_context("spawn")  # no torch state forked
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.procs: list[Any] = []
        per = -(-ranks // processes)
        self.blocks = [range(at, min(ranks, at + per)) for at in range(0, ranks, per)]
        for block in self.blocks:
            here, there = spawn.Pipe()
            proc = spawn.Process(target=_worker, args=(there, host, block))
            proc.start()
            self.pipes.append(here)
            self.procs.append(proc)
        self.gather()  # every rank's client is up

    def gather(self) -> list[Any]:
        """Each worker's answer, joined in rank order."""
        out: list[Any] = []
        for pipe in self.pipes:
            got = pipe.recv()
            if isinstance(got, BaseException):
                raise RuntimeError(f"a worker failed: {got!r}") from got
            out.extend(got if isinstance(got, list) else [])
        return out

    def tell(self, what: str, *args: Any) -> list[Any]:
        for pipe in self.pipes:
            pipe.send((what, *args))
        return self.gather()

    def scatter(self, what: str, per_rank: list[Any]) -> list[Any]:
        for pipe, block in zip(self.pipes, self.blocks, strict=True):
            pipe.send((what, per_rank[block.start : block.stop]))
        return self.gather()

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):  # that worker is gone already
                pipe.send(("stop",))
        for proc in self.procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()


def save_and_load(
    storage: Storage, ranks: int = 1024, processes: int = 4, *, seed: int = 0, warm_up: bool = True
) -> Outcome:
    """``ranks`` ranks in ``processes`` processes save one checkpoint to ``storage``, then
    load it back (see the module). Each ``seed`` gives other bytes: a graben store skips
    chunks it holds already, so each measured save needs a seed of its own.

    With ``warm_up``, one save beside it first, untimed: a job saves many times from
    the same processes, and the first save opens the connections.
    """
    raise_open_files()
    workers = Workers(partial(_Ranks, storage), ranks, processes)
    client = storage.client()
    try:
        if warm_up:
            _save(workers, storage.at("-warmup"), client, seed=2 * seed + 1)
        saved = 2 * seed + 2
        cpu = tree_cpu()
        publish = _save(workers, storage, client, seed=saved)
        cpu = tree_cpu() - cpu
        connections = {} if client is None else _connections(storage.store, client)
        started = time.perf_counter()
        wrong = workers.tell("load", storage, saved)
        load = time.perf_counter() - started
        if wrong:
            raise AssertionError(f"{len(wrong)} ranks loaded other bytes: {wrong[:3]}")
    finally:
        workers.close()
        if client is not None:
            client.close()
    return Outcome(ranks, len(workers.procs), publish, load, connections, saved, cpu)


def tree_cpu(root: int | None = None) -> float:
    """CPU seconds (user + system, all threads) used so far by ``root`` (this process)
    and every process below it that is still running (``/proc``)."""
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        parents[int(entry)] = int(fields[1])
        used[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += used.get(pid, 0.0)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return total


def _save(workers: Workers, storage: Storage, client: Client | None, seed: int) -> float:
    """One save; seconds from the ranks told to write to the published checkpoint."""
    plans = workers.tell("plan", storage, seed)
    coordinator, planner = storage.writer(client), DefaultSavePlanner()
    coordinator.set_up_storage_writer(True)
    planner.set_up_planner({}, coordinator.storage_meta(), True)
    global_plans, metadata = planner.create_global_plan(plans)
    global_plans = coordinator.prepare_global_plan(global_plans)
    started = time.perf_counter()
    results = workers.scatter("write", global_plans)
    coordinator.finish(metadata, results)
    return time.perf_counter() - started


def _connections(url: str, client: Client) -> dict[str, int]:
    """Established connections to each metadata service and data node (on this host)."""
    metas = [f"{host}:{port}" for host, port in endpoints(urlsplit(url).netloc, url)]
    addresses = [*metas, *(n.address for n in client.health().nodes)]
    return {address: established(address) for address in addresses}


def established(address: str) -> int:
    """TCP connections established to ``host:port`` on this host, counted from the
    server's end (``/proc/net/tcp``)."""
    port = int(address.rpartition(":")[2])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, state = fields[1], fields[3]
                    if state == "01" and int(local.rpartition(":")[2], 16) == port:
                        count += 1
        except FileNotFoundError:
            continue
    return count


if __name__ == "__main__":  # by hand: python -m graben.bench._ranks URL [RANKS]
    import sys

    world = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    print(save_and_load(Storage(sys.argv[1], "/ranks/ckpt"), world))
