"""Batching of concurrent calls (group commit) and the engine's grouped commits."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec
import pytest

from graben.store import AlreadyExists, AsyncClient, FileInfo, IntegrityError, connect
from graben.store._batcher import Batcher, Batchers
from graben.store._hashing import chunk_ref
from graben.store._types import FileCommit
from graben.store.meta import Metadata
from graben.store.meta.engines._sqlite import SQLiteRepository
from graben.store.node._chunkstore import LocalChunkStore


class Recorder:
    """A ``run`` that records its groups and fails the items it is told to."""

    def __init__(self, fail: set[int] | None = None, delay: float = 0.01) -> None:
        self.groups: list[list[int]] = []
        self.fail, self.delay = fail or set(), delay
        self.running = self.most_running = 0

    async def __call__(self, items: list[int]) -> list[int | Exception]:
        self.groups.append(items)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        await asyncio.sleep(self.delay)
        self.running -= 1
        return [ValueError(i) if i in self.fail else i * 10 for i in items]


def test_an_item_whose_caller_gave_up_before_its_group_ran_is_not_sent() -> None:
    """A writer past its deadline reuses its buffer: a queued item must not go out."""

    async def test() -> list[list[int]]:
        run = Recorder(delay=0.1)
        batcher: Batcher[int, int] = Batcher(run, concurrency=1)
        first = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0.01)  # group [1] running; 2 and 3 wait behind it
        waiting = asyncio.ensure_future(batcher.submit(2))
        kept = asyncio.ensure_future(batcher.submit(3))
        await asyncio.sleep(0.01)
        waiting.cancel()
        assert await first == 10 and await kept == 30
        return run.groups

    assert asyncio.run(test()) == [[1], [3]]


def test_items_arriving_together_share_a_group() -> None:
    run = Recorder()

    async def scenario() -> list[int]:
        batcher: Batcher[int, int] = Batcher(run)
        first = await batcher.submit(-1)  # idle: goes at once, alone
        return [first, *await asyncio.gather(*(batcher.submit(i) for i in range(100)))]

    assert asyncio.run(scenario()) == [-10, *(i * 10 for i in range(100))]
    assert run.groups == [[-1], list(range(100))]


def test_groups_respect_the_size_limit_and_concurrency() -> None:
    run = Recorder()

    async def scenario() -> None:
        batcher: Batcher[int, int] = Batcher(run, max_size=10, concurrency=3)
        await asyncio.gather(*(batcher.submit(i) for i in range(100)))

    asyncio.run(scenario())
    assert [len(g) for g in run.groups] == [10] * 10
    assert run.most_running == 3


def test_one_item_failing_fails_only_its_caller() -> None:
    async def scenario() -> list[int | BaseException]:
        batcher: Batcher[int, int] = Batcher(Recorder(fail={3}))
        return await asyncio.gather(*(batcher.submit(i) for i in range(6)), return_exceptions=True)

    results = asyncio.run(scenario())
    assert isinstance(results[3], ValueError)
    assert [r for i, r in enumerate(results) if i != 3] == [0, 10, 20, 40, 50]


def test_a_failing_group_fails_each_of_its_items() -> None:
    async def boom(items: list[int]) -> list[int | Exception]:
        raise OSError("disk gone")

    async def scenario() -> list[int | BaseException]:
        batcher: Batcher[int, int] = Batcher(boom)
        return await asyncio.gather(*(batcher.submit(i) for i in range(5)), return_exceptions=True)

    assert all(isinstance(r, OSError) for r in asyncio.run(scenario()))


def test_an_item_submitted_as_the_queue_empties_is_not_stranded() -> None:
    async def scenario() -> None:
        batcher: Batcher[int, int] = Batcher(Recorder(delay=0))
        for i in range(200):  # each submit lands just as the previous drain finishes
            assert await asyncio.wait_for(batcher.submit(i), 5) == i * 10

    asyncio.run(scenario())


def test_a_caller_that_gives_up_does_not_break_the_group() -> None:
    async def scenario() -> int:
        batcher: Batcher[int, int] = Batcher(Recorder(delay=0.05))
        first = asyncio.ensure_future(batcher.submit(1))
        late = asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0.01)
        late.cancel()
        return await first + await batcher.submit(3)

    assert asyncio.run(scenario()) == 40


def test_a_group_commit_keeps_the_batches_that_succeed(tmp_path: Path) -> None:
    with connect(tmp_path / "s") as client:
        client.put("/taken", b"x")
    namespace = Metadata(SQLiteRepository(tmp_path / "s" / "meta.db"))
    try:
        batches = [
            (FileCommit("/a", (), (), "create"),),
            (FileCommit("/b", (), (), "create"), FileCommit("/taken", (), (), "create")),
            (FileCommit("/c", (), (), "create"),),
        ]
        results = namespace.commits.commit_group(batches)
        assert isinstance(results[1], AlreadyExists)
        assert [r[0].path for r in (results[0], results[2]) if isinstance(r, list)] == ["/a", "/c"]
        with pytest.raises(FileNotFoundError):
            namespace.namespace.stat("/b")  # all of its batch or none of it
        assert namespace.namespace.stat("/taken").size == 1
    finally:
        namespace.repo.close()


def test_a_chunk_group_refuses_only_the_bad_chunk(tmp_path: Path) -> None:
    store = LocalChunkStore(tmp_path / "chunks")
    try:
        good, bad = os.urandom(5000), os.urandom(5000)
        wrong = msgspec.structs.replace(chunk_ref(bad), crc32c=0)
        errors = store.write_group([(chunk_ref(good), memoryview(good)), (wrong, memoryview(bad))])
        assert errors[0] is None
        assert isinstance(errors[1], IntegrityError)
        into = bytearray(5000)
        store.read(chunk_ref(good), memoryview(into))
        assert into == good
        assert [c for c, _ in store.inventory()] == [chunk_ref(good).id]
    finally:
        store.close()


def test_concurrent_puts_on_a_cluster_commit_independently(cluster_url: str) -> None:
    async def scenario() -> list[object]:
        async with AsyncClient(cluster_url) as client:
            await client.put("/group/taken", b"first")
            puts = [client.put(f"/group/{i}", b"%d" % i) for i in range(40)]
            puts.insert(20, client.put("/group/taken", b"second", exclusive=True))
            results = await asyncio.gather(*puts, return_exceptions=True)
            assert await client.get("/group/taken") == b"first"
            assert [await client.get(f"/group/{i}") for i in range(40)] == [
                b"%d" % i for i in range(40)
            ]
            return results

    results = asyncio.run(scenario())
    assert isinstance(results.pop(20), AlreadyExists)
    assert all(isinstance(r, FileInfo) for r in results)


def test_batchers_make_one_batcher_per_key() -> None:
    made: list[str] = []

    def make(key: str) -> Batcher[int, int]:
        made.append(key)
        return Batcher(Recorder())

    batchers: Batchers[str, int, int] = Batchers(make)
    assert batchers["a"] is batchers["a"]
    assert batchers["b"] is not batchers["a"]
    assert made == ["a", "b"]
