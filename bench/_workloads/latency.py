"""The metadata engine at a distance: small-file writes with 2 ms between the metadata
services and PostgreSQL.

On loopback a round trip to the database costs next to nothing, so how many
of them a write takes, and whether concurrent writers wait for each other's,
does not show. Here a ``delaying_proxy`` (``_delay.py``: this kernel has no
``tc netem``) stands between the services and the run's PostgreSQL server,
adding ``LATENCY_S`` to every round trip, as a database on another host
would; the services' ``--engine`` URL names the proxy. The writes are
``cluster-small-files``' (4 KiB ``AsyncClient.put``, RF=1, on a 3-node
cluster), in three rows, each the baseline of the next: one service and one
writer; one service and 64 writers (what concurrency buys); two services and
the 64 writers spread over both (what a second service buys).

Each row stops taking new files after ``budget_s`` (what is under way then is
finished and counted), so a slow engine still keeps ``--quick`` short.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from time import perf_counter
from urllib.parse import urlsplit

from graben.store import AsyncClient, Unavailable
from graben.store.local import cluster_up, make_secret_file
from graben.store.wire import auth

from .._context import Context
from .._delay import delaying_proxy
from .._postgres import PgServer
from .._registry import Result, Skip, workload
from .cluster import CLIENTS, SMALL, endpoints, postgres

NAME = "meta-latency"
LATENCY_S = 0.002
"""Added to every round trip between a metadata service and PostgreSQL."""
ROWS = ((1, 1), (1, CLIENTS), (2, CLIENTS))
"""(metadata services, concurrent writers) of each row; each row's baseline is the one before."""
FILES = {True: (1000, 8.0), False: (4000, 30.0)}
"""Files a row writes at most, and the seconds after which it takes no new one: with
``--quick`` (True) and without."""
PINGS = 20
"""``SELECT 1`` round trips timed to report what the proxy adds."""
Address = tuple[str, int]
"""A host and port to dial."""
Cluster = tuple[str, str]
"""A cluster's URL and its clients' token."""


def system(services: int, writers: int) -> str:
    """A row's name, e.g. ``PostgreSQL +2 ms latency, 2 services, 64 writers``."""
    return (
        f"PostgreSQL +{LATENCY_S * 1e3:g} ms latency, "
        f"{_plural(services, 'service')}, {_plural(writers, 'writer')}"
    )


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@contextmanager
def delayed_postgres(ctx: Context) -> Iterator[tuple[PgServer, Address]]:
    """A fixture: the run's PostgreSQL server and a proxy to it adding ``LATENCY_S``."""
    if ctx.target is not None:
        raise Skip("--target: no cluster of the bench's own is started")
    server = ctx.fixture(postgres)
    if isinstance(server, str):
        raise Skip(server)
    with delaying_proxy("127.0.0.1", server.port, LATENCY_S) as address:
        direct, proxied = (_round_trip_ms(_via(server.url("postgres"), a)) for a in (None, address))
        ctx.console.print(
            f"{NAME}: a round trip to PostgreSQL takes {proxied:.2f} ms through the proxy, "
            f"{direct:.2f} ms directly (SELECT 1, median of {PINGS})"
        )
        yield server, address


def _via(url: str, address: Address | None) -> str:
    """``url`` dialling ``address`` instead of its own host and port (``None``: unchanged)."""
    if address is None:
        return url
    parts = urlsplit(url)
    login = parts.netloc.rpartition("@")[0]
    return parts._replace(netloc=f"{login}@{address[0]}:{address[1]}").geturl()


def _round_trip_ms(url: str) -> float:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        times = []
        for _ in range(PINGS):
            start = perf_counter()
            conn.execute("SELECT 1")
            times.append(perf_counter() - start)
    return statistics.median(times) * 1e3


def _delayed_cluster(services: int) -> Callable[[Context], AbstractContextManager[Cluster]]:
    """A fixture: 3 nodes and ``services`` metadata services whose engine, a database
    of its own, they reach through the proxy; yields its URL and a client's token."""

    @contextmanager
    def cluster(ctx: Context) -> Iterator[Cluster]:
        server, address = ctx.fixture(delayed_postgres)
        engine = _via(server.url(server.create_database()), address)
        root = ctx.shared / f"cluster-latency-{services}"
        root.mkdir(parents=True, exist_ok=True)
        # A secret of its own, given to its clients as a token: $GRABEN_SECRET_FILE is the
        # run's other clusters', and this fixture must not change it under them.
        secret = make_secret_file(root / "secret")
        token = auth.client_token(auth.load_secret(secret))
        try:
            with cluster_up(root, 3, secret, engine=engine, services=services) as url:
                yield url, token
        except Unavailable as exc:
            raise Skip(str(exc)) from None

    return cluster


CLUSTERS = {services: _delayed_cluster(services) for services in {s for s, _ in ROWS}}


@workload(NAME, "4 KiB puts/s with 2 ms to PostgreSQL: 1 vs 64 writers, 1 vs 2 services")
def meta_latency(ctx: Context) -> list[Result]:
    """Small-file writes through metadata services 2 ms from their database: one writer,
    64 writers, then 64 writers over two services; each row against the one before."""
    count, budget_s = FILES[ctx.quick]
    results: list[Result] = []
    for services, writers in ROWS:
        url, token = ctx.fixture(CLUSTERS[services])
        label = system(services, writers)
        prefix = f"/bench/latency/{ctx.trial}-{services}-{writers}"
        with ctx.step(f"{NAME}: {label}", count) as tick:
            done, seconds = asyncio.run(
                _puts(endpoints(url), token, writers, prefix, count, budget_s, tick)
            )
        baseline = results[-1].system if results else label
        results.append(Result(NAME, label, done / seconds, "files/s", baseline))
    return results


async def _puts(
    urls: list[str],
    token: str,
    writers: int,
    prefix: str,
    count: int,
    budget_s: float,
    tick: Callable[[int], None],
) -> tuple[int, float]:
    """Up to ``count`` new 4 KiB files under ``prefix`` from ``writers`` concurrent writers
    spread over ``urls`` (a client each), taking no new file after ``budget_s``; the files
    written and the seconds they took. The files stay, in a cluster removed with the run:
    removing them through the delayed engine would only make the run longer."""
    clients = [AsyncClient(url, token=token) for url in urls]
    try:
        for i, client in enumerate(clients):  # connected, and the directory made, untimed
            await client.put(f"{prefix}/warm-{i}", os.urandom(SMALL), replication=1)
        payloads = [os.urandom(SMALL) for _ in range(count)]  # distinct: no put is deduplicated
        files = iter(range(count))
        start = perf_counter()
        deadline = start + budget_s

        async def writer(client: AsyncClient) -> int:
            done = 0
            for i in files:  # shared: each file is taken by one writer
                await client.put(f"{prefix}/{i}", payloads[i], replication=1)
                tick(1)
                done += 1
                if perf_counter() >= deadline:
                    break
            return done

        done = await asyncio.gather(*(writer(clients[i % len(clients)]) for i in range(writers)))
        return sum(done), perf_counter() - start
    finally:
        for client in clients:
            await client.close()
