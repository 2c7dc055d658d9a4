"""A put lets go of the caller's buffer when it returns (issue 17): the FUSE
mount puts a mapped spool file and closes the mapping right after, and a slice
kept a moment longer (by a worker thread's leftover arguments, a batcher's
last group) made that close fail with ``BufferError``, and fsync say EIO."""

from __future__ import annotations

import mmap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from graben.store import Client


@pytest.mark.parametrize("size", [4096, 200_000], ids=["small", "hashed-in-a-thread"])
def test_a_mapping_put_by_16_threads_closes_right_after_the_put(client: Client, size: int) -> None:
    kept: list[int] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        region = mmap.mmap(-1, size)
        region[:4] = i.to_bytes(4, "little")
        with memoryview(region) as view:
            client.put(f"/f{i}", view)
        try:
            region.close()
        except BufferError:
            with lock:
                kept.append(i)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(800 if size == 4096 else 200)))
    assert kept == [], f"{len(kept)} puts kept a view of their buffer past their return"
    assert client.get_range("/f7", 0, 4) == (7).to_bytes(4, "little")
