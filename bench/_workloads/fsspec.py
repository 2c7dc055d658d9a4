"""fsspec workloads: ``graben://`` beside the direct client and beside s3fs on moto.

``cat_file`` and ``pipe_file`` of one large object through ``graben://`` (the
3-node cluster, RF=1 so the door's cost is not hidden behind replication),
through the store's own client, and through s3fs to moto's S3 server in the
same run, on the same bytes. Targets (issue "fsspec URL scheme"): >= 0.9x the
direct client and >= 5x s3fs on moto.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from time import perf_counter
from typing import Any

from graben.store import GrabenFileSystem, connect

from .._context import Context
from .._kit import free_port, gbps, random_data
from .._registry import Result, Skip, workload
from .cluster import local_cluster

GBPS = "GB/s"
CLIENT = "graben client"
System = tuple[str, Callable[[], object]]


@contextmanager
def moto_s3(_ctx: Context) -> Iterator[Any]:
    """A fixture: moto's S3 server on loopback and an s3fs filesystem with a bucket on it."""
    try:
        import s3fs
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        raise Skip(f"the s3fs peer needs s3fs and moto[server] ({exc})") from None
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # else a line per request
    try:
        fs = s3fs.S3FileSystem(
            key="bench",
            secret="bench",
            client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "eu-west-1"},
            skip_instance_cache=True,
        )
        # moto keeps its buckets per process, not per server: an earlier one may have made it
        fs.makedirs("bench", exist_ok=True)
        yield fs
    finally:
        server.stop()


def aws_env(s3_options: dict[str, Any]) -> dict[str, str]:
    """Where moto is and its keys, as the AWS clients that take no options read them
    (s3torchconnector's native client among them)."""
    return {
        "AWS_ENDPOINT_URL": s3_options["client_kwargs"]["endpoint_url"],
        "AWS_REGION": s3_options["client_kwargs"]["region_name"],
        "AWS_ACCESS_KEY_ID": s3_options["key"],
        "AWS_SECRET_ACCESS_KEY": s3_options["secret"],
    }


def _timed(fn: Callable[[], object]) -> float:
    start = perf_counter()
    fn()
    return perf_counter() - start


def _abba(systems: Sequence[System]) -> list[System]:
    """Each system twice, once before and once after the other: the disk's drift
    between runs (it moved single runs by 20% here) falls on both alike."""
    return [*systems, *reversed(systems)]


@workload("fsspec-pipe", "fsspec pipe_file to graben:// vs the direct client vs s3fs on moto")
def fsspec_pipe(ctx: Context) -> list[Result]:
    """One object written whole: ``fs.pipe_file`` against ``client.put`` and s3fs."""
    url, data, s3 = ctx.fixture(local_cluster), ctx.fixture(random_data), ctx.fixture(moto_s3)
    fs = GrabenFileSystem(url=url, replication=1, skip_instance_cache=True)
    try:
        with memoryview(data) as view, connect(url, replication=1) as client:
            payload = view[: ctx.size]
            systems = [
                ("graben fsspec", lambda: fs.pipe_file("/bench/fsspec-pipe", payload)),
                (CLIENT, lambda: client.put("/bench/fsspec-pipe", payload)),
            ]
            times = dict.fromkeys((name for name, _ in systems), 0.0)
            with ctx.step("fsspec pipe_file / client put", 4 * ctx.size) as tick:
                for name, run in _abba(systems):
                    times[name] += _timed(run)
                    client.rm("/bench/fsspec-pipe")  # or the next write would dedup
                    tick(ctx.size)
            s3_bytes = bytes(view[: ctx.size])
        with ctx.step("s3fs pipe_file to moto", len(s3_bytes)) as tick:
            s3_time = _timed(lambda: s3.pipe_file("bench/pipe", s3_bytes))
            tick(len(s3_bytes))
        s3.rm("bench/pipe")
    finally:
        fs.client.close()
    name = "fsspec-pipe"
    return [
        *(Result(name, s, gbps(2 * ctx.size, t), GBPS, CLIENT) for s, t in times.items()),
        Result(name, "s3fs -> moto", gbps(len(s3_bytes), s3_time), GBPS, CLIENT),
    ]


@workload("fsspec-cat", "fsspec cat_file from graben:// vs the direct client vs s3fs on moto")
def fsspec_cat(ctx: Context) -> list[Result]:
    """One object read whole: ``fs.cat_file`` against ``client.get`` and s3fs."""
    url, data, s3 = ctx.fixture(local_cluster), ctx.fixture(random_data), ctx.fixture(moto_s3)
    fs = GrabenFileSystem(url=url, skip_instance_cache=True)
    path = "/bench/fsspec-cat"
    try:
        with memoryview(data) as view, connect(url, replication=1) as client:
            client.put(path, view[: ctx.size])
            s3.pipe_file("bench/cat", bytes(view[: ctx.size]))
        fs.client.get(path)  # untimed: the first large result pays to map fresh memory
        systems = [
            ("graben fsspec", lambda: fs.cat_file(path)),
            (CLIENT, lambda: fs.client.get(path)),
        ]
        times = dict.fromkeys((name for name, _ in systems), 0.0)
        with ctx.step("fsspec cat_file / client get", 4 * ctx.size) as tick:
            for name, read in _abba(systems):
                times[name] += _timed(read)
                tick(ctx.size)
        s3_size = s3.size("bench/cat")
        with ctx.step("s3fs cat_file from moto", s3_size) as tick:
            s3_time = _timed(lambda: s3.cat_file("bench/cat"))
            tick(s3_size)
        s3.rm("bench/cat")
        fs.client.rm(path)
    finally:
        fs.client.close()
    name = "fsspec-cat"
    return [
        *(Result(name, s, gbps(2 * ctx.size, t), GBPS, CLIENT) for s, t in times.items()),
        Result(name, "s3fs -> moto", gbps(s3_size, s3_time), GBPS, CLIENT),
    ]
