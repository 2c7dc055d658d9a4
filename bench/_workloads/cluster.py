"""Cluster workloads: a local 3-node cluster on loopback, beside the disk's limit.

One cluster (``graben cluster up``, separate processes) serves every trial of a
run. Each workload measures the plain-file peer in the same trial. Targets
(issue "Cluster"): RF=1 write >= 0.8x plain write+fsync, RF=3 >= 0.8x a third
of it, warm read >= 1.5 GB/s, >= 5,000 create+commit/s from 64 clients.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from time import perf_counter
from urllib.parse import urlsplit

from graben.store import AsyncClient, Client, Unavailable, connect
from graben.store._config import cluster_url
from graben.store._config import endpoints as parse_endpoints
from graben.store._hashing import chunk_ref
from graben.store.local import cluster_up, make_secret_file
from graben.store.transport._remote import RemoteChunks
from graben.store.transport._requests import Prepare

from .._context import Context
from .._kit import BLOCK, block_buffer, drain, environ, gbps, random_data, write_all
from .._postgres import NoPostgres, PgServer
from .._postgres import start as start_postgres
from .._registry import Result, Skip, workload

BENCH_ROOT = f"/.graben-bench-{uuid.uuid4().hex[:12]}"
"""Where this run writes on a cluster (a name no user holds); removed whole after each use."""

GBPS = "GB/s"
PLAIN_WRITE = "plain write+fsync"
CLIENTS = 64
SMALL = 4096


@contextmanager
def local_cluster(ctx: Context) -> Iterator[str]:
    """A fixture: ``graben cluster up --nodes 3`` for the whole run; yields its URL.

    The bench's clients find the cluster's secret as a user's would, in
    ``$GRABEN_SECRET_FILE``, set for as long as the cluster runs. With ``--target
    graben://...`` nothing is started: the target is the cluster (its secret is the
    user's, as for any client).
    """
    if ctx.target_url is not None:
        yield ctx.target_url
        return
    if ctx.target_path is not None:
        raise Skip(f"--target {ctx.target_path} is a directory: no cluster to measure")
    root = ctx.shared / "cluster"
    root.mkdir(parents=True, exist_ok=True)
    secret = make_secret_file(root / "secret")
    try:
        with (
            environ({"GRABEN_SECRET_FILE": str(secret)}),
            cluster_up(root, 3, secret_file=secret) as url,
        ):
            yield url
    except Unavailable as exc:
        raise Skip(str(exc)) from None


def _plain_write(ctx: Context, data: mmap.mmap) -> float:
    path = ctx.scratch / "plain.bin"
    with memoryview(data) as view:
        start = perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for offset in range(0, ctx.size, BLOCK):
                write_all(fd, view[offset : offset + BLOCK])
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = perf_counter() - start
    path.unlink()
    return seconds


def _cluster_write(ctx: Context, client: Client, data: mmap.mmap, replication: int) -> float:
    path = f"{BENCH_ROOT}/write-rf{replication}"
    with memoryview(data) as view, ctx.step(f"cluster write RF={replication}", ctx.size) as tick:
        start = perf_counter()
        client.put(path, view[: ctx.size], replication=replication)
        seconds = perf_counter() - start
        tick(ctx.size)
    client.rm(BENCH_ROOT, recursive=True)  # a live copy would let the next trial dedup it all
    return seconds


@workload("cluster-write-rf1", "durable write to a 3-node cluster, RF=1, vs plain write+fsync")
def cluster_write_rf1(ctx: Context) -> list[Result]:
    """RF=1 through the cluster beside the disk's fsync'd write."""
    url, data = ctx.fixture(local_cluster), ctx.fixture(random_data)
    with connect(url) as client:
        graben = _cluster_write(ctx, client, data, 1)
    plain = _plain_write(ctx, data)
    name = "cluster-write-rf1"
    return [
        Result(name, "graben cluster RF=1", gbps(ctx.size, graben), GBPS, PLAIN_WRITE),
        Result(name, PLAIN_WRITE, gbps(ctx.size, plain), GBPS, PLAIN_WRITE),
    ]


@workload("cluster-write-rf3", "durable write to a 3-node cluster, RF=3, vs a third of plain")
def cluster_write_rf3(ctx: Context) -> list[Result]:
    """RF=3 writes three copies to one disk here: the peer is a third of plain write+fsync."""
    url, data = ctx.fixture(local_cluster), ctx.fixture(random_data)
    with connect(url) as client:
        graben = _cluster_write(ctx, client, data, 3)
    third = gbps(ctx.size, _plain_write(ctx, data)) / 3
    name, peer = "cluster-write-rf3", "plain write+fsync / 3"
    return [
        Result(name, "graben cluster RF=3", gbps(ctx.size, graben), GBPS, peer),
        Result(name, peer, third, GBPS, peer),
    ]


@workload("cluster-replication", "RF=3 chunk writes: fan-out from the client vs chain via nodes")
def cluster_replication(ctx: Context) -> list[Result]:
    """The same chunks written three ways over: the client sending each replica
    itself (fan-out, what writers use) against passing it down a chain of nodes."""
    url, data = ctx.fixture(local_cluster), ctx.fixture(random_data)
    fanout, chain = asyncio.run(_replicate_both(ctx, url, data))
    name, peer = "cluster-replication", "fan-out (graben's choice)"
    return [
        Result(name, peer, gbps(ctx.size, fanout), GBPS, peer),
        Result(name, "chain", gbps(ctx.size, chain), GBPS, peer),
    ]


async def _replicate_both(ctx: Context, url: str, data: mmap.mmap) -> tuple[float, float]:
    async with AsyncClient(url) as client:
        chunks = client.chunks
        assert isinstance(chunks, RemoteChunks)
        view = memoryview(data)[: ctx.size]
        step = client.options.chunk_size
        pieces = [view[i : i + step] for i in range(0, ctx.size, step)]
        refs = [chunk_ref(p) for p in pieces]
        placements = await client.meta.request(Prepare(tuple(refs), 3))
        slots = asyncio.Semaphore(client.options.max_inflight)

        async def fan(i: int) -> None:
            async with slots:
                nodes = placements[i].nodes
                await asyncio.gather(*(chunks.write(n, refs[i], pieces[i]) for n in nodes))

        async def chain(i: int) -> None:
            async with slots:
                await chunks.write_chain(placements[i].nodes, refs[i], pieces[i])

        times = []
        for how, label in ((fan, "fan-out"), (chain, "chain")):
            with ctx.step(f"RF=3 {label}", ctx.size) as tick:
                start = perf_counter()
                await asyncio.gather(*(how(i) for i in range(len(pieces))))
                times.append(perf_counter() - start)
                tick(ctx.size)
        pieces.clear()  # no view of the shared buffer may outlive the run
        view.release()
        return times[0], times[1]


@workload("cluster-read", "warm sequential read from a 3-node cluster vs plain read")
def cluster_read(ctx: Context) -> list[Result]:
    """Read back a file through the cluster (page cache warm on the nodes)."""
    url, data, buffer = (
        ctx.fixture(local_cluster),
        ctx.fixture(random_data),
        ctx.fixture(block_buffer),
    )
    plain_path = ctx.scratch / "plain.bin"
    plain_path.write_bytes(memoryview(data)[: ctx.size])
    with (
        connect(url) as client,
        connect(url, read_check="crc32c") as trusting,
        memoryview(buffer) as view,
    ):
        client.put(f"{BENCH_ROOT}/read", memoryview(data)[: ctx.size], replication=1)
        took: dict[str, list[float]] = {"blake3": [], "crc32c": []}
        both = (("blake3", client), ("crc32c", trusting))
        for turn in range(5):  # the first is the cold one; then each check, in turns
            for check, reader in both[:1] if turn == 0 else both[:: 1 if turn % 2 else -1]:
                with (
                    reader.open(f"{BENCH_ROOT}/read") as f,
                    ctx.step(f"cluster read ({check})", ctx.size) as tick,
                ):
                    start = perf_counter()
                    drain(f.readinto, view, tick)
                    took[check].append(perf_counter() - start)
        graben, crc_only = min(took["blake3"][1:]), min(took["crc32c"])
        client.rm(BENCH_ROOT, recursive=True)
        with open(plain_path, "rb", buffering=0) as f:
            start = perf_counter()
            drain(f.readinto, view, lambda _n: None)
            plain = perf_counter() - start
        tcp = _loopback(plain_path, ctx.size, view)
    name = "cluster-read"
    return [
        Result(name, "graben cluster", gbps(ctx.size, graben), GBPS, "plain read"),
        Result(name, CRC_ONLY, gbps(ctx.size, crc_only), GBPS, "plain read"),
        Result(name, "plain read", gbps(ctx.size, plain), GBPS, "plain read"),
        Result(name, LOOPBACK, gbps(ctx.size, tcp), GBPS, "plain read"),
    ]


CRC_ONLY = "graben cluster, crc32c only (read_check, no blake3)"
"""What checking every read's blake3 costs: the same read, checking the transfer only."""
LOOPBACK = "loopback TCP: sendfile -> recv_into, no checksum"
"""The cluster read's ceiling here: the same bytes from the page cache over one socket."""


def _loopback(path: Path, size: int, into: memoryview) -> float:
    """Seconds to move ``size`` bytes of ``path`` (cached) from ``sendfile`` to
    ``recv_into`` over one loopback connection: what a node and a client do, bare."""
    with socket.create_server(("127.0.0.1", 0)) as server:

        def send() -> None:
            conn, _ = server.accept()
            with conn, open(path, "rb") as f:
                conn.sendfile(f, 0, size)

        with ThreadPoolExecutor(1) as sender:
            sent = sender.submit(send)
            with socket.create_connection(server.getsockname()) as sock:
                start = perf_counter()
                got = 0
                while got < size:
                    n = sock.recv_into(into[: min(into.nbytes, size - got)])
                    if n == 0:
                        raise ConnectionError("the sender stopped early")
                    got += n
                took = perf_counter() - start
            sent.result()
    return took


SQLITE_CLUSTER = f"graben cluster, {CLIENTS} clients"
"""The SQLite cluster's row: the PostgreSQL rows' baseline."""
ENGINES = ((1, "PostgreSQL, 1 service"), (2, "PostgreSQL, 2 services"))
"""The PostgreSQL clusters measured beside SQLite: metadata services, and the row's name."""


@contextmanager
def postgres(ctx: Context) -> Iterator[PgServer | str]:
    """A fixture: a throwaway PostgreSQL server for the whole run, or why there is none."""
    try:
        server = start_postgres()
    except NoPostgres as exc:
        yield str(exc)
        return
    try:
        yield server
    finally:
        server.close()


def _pg_cluster(services: int) -> Callable[[Context], AbstractContextManager[str]]:
    """A fixture: 3 nodes and ``services`` metadata services on a database of their own."""

    @contextmanager
    def cluster(ctx: Context) -> Iterator[str]:
        if ctx.target is not None:
            raise Skip("--target: no cluster of the bench's own is started")
        server = ctx.fixture(postgres)
        if isinstance(server, str):
            raise Skip(server)
        engine = server.url(server.create_database())
        root = ctx.shared / f"cluster-pg-{services}"
        root.mkdir(parents=True, exist_ok=True)
        secret = Path(os.environ["GRABEN_SECRET_FILE"])  # the SQLite cluster's, made first
        with cluster_up(root, 3, secret, engine=engine, services=services) as url:
            yield url

    return cluster


PG_CLUSTERS = {services: _pg_cluster(services) for services, _ in ENGINES}


def _with_postgres(
    ctx: Context, measure: Callable[[list[str]], float], name: str, unit: str
) -> list[Result]:
    """Rows of ``measure`` (count per second of its endpoints) on each PostgreSQL cluster,
    against the SQLite cluster's row; left out, saying why, where PostgreSQL cannot run."""
    results = []
    for services, system in ENGINES:
        try:
            url = ctx.fixture(PG_CLUSTERS[services])
        except Skip as exc:
            ctx.console.print(f"{name}: {system} left out: {exc}")
            continue
        results.append(Result(name, system, measure(endpoints(url)), unit, SQLITE_CLUSTER))
    return results


def endpoints(url: str) -> list[str]:
    """One URL per metadata service of a cluster's ``graben://h1:p1,h2:p2`` URL."""
    hosts = urlsplit(url).netloc
    return [cluster_url((address,)) for address in parse_endpoints(hosts, url)]


@workload("cluster-small-files", f"4 KiB file create+commit/s, {CLIENTS} clients, vs plain files")
def cluster_small_files(ctx: Context) -> list[Result]:
    """Many small files from 64 concurrent clients; the peer creates and fsyncs plain files.

    On PostgreSQL too, with one metadata service and with two (the clients
    spread over them), against the SQLite cluster.
    """
    url = ctx.fixture(local_cluster)
    count = 1000 if ctx.quick else 4000
    payloads = [os.urandom(SMALL) for _ in range(count)]

    def measure(urls: list[str]) -> float:
        return count / asyncio.run(_small_graben(urls, payloads, ctx))

    name, unit = "cluster-small-files", "files/s"
    graben = measure([url])
    plain = count / _small_plain(ctx, payloads)
    return [
        Result(name, SQLITE_CLUSTER, graben, unit, "plain create+fsync"),
        Result(name, "plain create+fsync", plain, unit, "plain create+fsync"),
        *_with_postgres(ctx, measure, name, unit),
    ]


async def _small_graben(
    urls: list[str],
    payloads: list[bytes],
    ctx: Context,
    *,
    token: str | None = None,
    root: str = BENCH_ROOT,
) -> float:
    """Seconds for ``CLIENTS`` writers to put ``payloads`` under ``root`` (then removed)."""
    clients = [AsyncClient(url, token=token) for url in urls]
    try:
        queue = list(enumerate(payloads))

        async def worker(client: AsyncClient) -> None:
            while queue:
                i, data = queue.pop()
                await client.put(f"{root}/small/{i}", data, replication=1)

        with ctx.step(f"cluster small files, {CLIENTS} clients", len(payloads)) as tick:
            start = perf_counter()
            await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(CLIENTS)))
            seconds = perf_counter() - start
            tick(len(payloads))
        await clients[0].rm(root, recursive=True)
    finally:
        for client in clients:
            await client.close()
    return seconds


def _small_plain(ctx: Context, payloads: list[bytes]) -> float:
    root = ctx.scratch / "small"
    root.mkdir()

    def write(item: tuple[int, bytes]) -> None:
        fd = os.open(root / str(item[0]), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, item[1])
            os.fsync(fd)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(CLIENTS) as pool:
        start = perf_counter()
        list(pool.map(write, enumerate(payloads)))
        return perf_counter() - start


@workload("cluster-meta-ops", f"stat calls/s from {CLIENTS} concurrent clients vs embedded")
def cluster_meta_ops(ctx: Context) -> list[Result]:
    """Metadata read rate over the wire beside the same calls on an embedded store; on
    PostgreSQL too, with one metadata service and two."""
    url = ctx.fixture(local_cluster)
    calls = 5000 if ctx.quick else 20000

    def measure(urls: list[str]) -> float:
        return calls / asyncio.run(_stats(urls, calls))

    name, unit = "cluster-meta-ops", "ops/s"
    return [
        Result(name, SQLITE_CLUSTER, measure([url]), unit, "graben embedded"),
        Result(
            name,
            "graben embedded",
            measure([str(ctx.scratch / "embedded")]),
            unit,
            "graben embedded",
        ),
        *_with_postgres(ctx, measure, name, unit),
    ]


async def _stats(urls: list[str], calls: int) -> float:
    clients = [AsyncClient(url) for url in urls]
    try:
        await clients[0].put(f"{BENCH_ROOT}/stat-me", b"x")
        left = [calls]

        async def worker(client: AsyncClient) -> None:
            while left[0] > 0:
                left[0] -= 1
                await client.stat(f"{BENCH_ROOT}/stat-me")

        start = perf_counter()
        await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(CLIENTS)))
        seconds = perf_counter() - start
        await clients[0].rm(BENCH_ROOT, recursive=True)
    finally:
        for client in clients:
            await client.close()
    return seconds
