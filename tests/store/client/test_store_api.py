"""The client API's conformance tests: every store kind must pass these."""

from __future__ import annotations

import asyncio
import errno
import gc
import io
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest
from store_kit import SMALL_CHUNK

from graben.store import (
    AlreadyExists,
    AsyncClient,
    Change,
    Client,
    DirectoryNotEmpty,
    GrabenError,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    NotADirectory,
    NotFound,
    connect,
)


def blob(n: int, seed: int = 0) -> bytes:
    return os.urandom(n) if seed == 0 else bytes((i * seed) % 251 for i in range(n))


# -- put / get ---------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, SMALL_CHUNK - 1, SMALL_CHUNK, 3 * SMALL_CHUNK + 17])
def test_put_get_round_trips_every_size(client: Client, size: int) -> None:
    data = blob(size)
    info = client.put("/d/file.bin", data)
    assert (info.size, info.kind, info.path) == (size, "file", "/d/file.bin")
    assert client.get("/d/file.bin") == data
    assert client.stat("/d/file.bin").size == size


def test_put_accepts_any_buffer(client: Client) -> None:
    data = bytearray(blob(1000))
    client.put("/a", memoryview(data)[10:500])
    assert client.get("/a") == bytes(data[10:500])


def test_get_range_cuts_at_end_and_spans_chunks(client: Client) -> None:
    data = blob(3 * SMALL_CHUNK + 5)
    client.put("/f", data)
    for start, end in [
        (0, 10),
        (SMALL_CHUNK - 3, SMALL_CHUNK + 3),
        (5, None),
        (len(data) - 2, len(data) + 100),
        (len(data) + 5, None),
    ]:
        assert client.get_range("/f", start, end) == data[start:end]
    with pytest.raises(InvalidArgument):
        client.get_range("/f", 10, 5)


def test_overwrite_replaces_content_and_bumps_generation(client: Client) -> None:
    first = client.put("/f", b"one")
    second = client.put("/f", b"two!")
    assert client.get("/f") == b"two!"
    assert second.generation == first.generation + 1
    assert second.size == 4


def test_exclusive_put_refuses_existing(client: Client) -> None:
    client.put("/f", b"one")
    with pytest.raises(AlreadyExists) as info:
        client.put("/f", b"two", exclusive=True)
    assert isinstance(info.value, FileExistsError)
    assert client.get("/f") == b"one"


def test_put_creates_parents_and_refuses_file_as_parent(client: Client) -> None:
    client.put("/a/b/c/d", b"x")
    assert client.stat("/a/b/c").is_dir
    with pytest.raises(NotADirectory):
        client.put("/a/b/c/d/e", b"y")
    with pytest.raises(IsADirectory):
        client.put("/a/b", b"y")


def test_get_missing_and_directory(client: Client) -> None:
    client.mkdir("/dir")
    with pytest.raises(NotFound) as missing:
        client.get("/nope")
    assert missing.value.errno == errno.ENOENT
    assert isinstance(missing.value, FileNotFoundError)
    with pytest.raises(IsADirectory):
        client.get("/dir")


# -- file objects ------------------------------------------------------------


def test_write_file_is_invisible_until_close(client: Client) -> None:
    data = blob(5 * SMALL_CHUNK + 123)
    f = client.open("/w.bin", "wb")
    for start in range(0, len(data), 10_000):
        f.write(data[start : start + 10_000])
        assert not client.exists("/w.bin")
    assert f.tell() == len(data)
    f.close()
    assert f.info is not None and f.info.size == len(data)
    assert client.get("/w.bin") == data


def test_exception_in_with_block_discards_the_file(client: Client) -> None:
    client.put("/keep", b"old")
    with pytest.raises(RuntimeError), client.open("/keep", "wb") as f:
        f.write(blob(3 * SMALL_CHUNK))
        raise RuntimeError("training crashed")
    assert client.get("/keep") == b"old"


def test_unclosed_writer_is_discarded_with_a_warning(client: Client) -> None:
    f = client.open("/lost", "wb")
    f.write(b"data")
    with pytest.warns(ResourceWarning, match="never closed"):
        del f
        gc.collect()
    assert not client.exists("/lost")


def test_xb_fails_at_open_and_at_close(client: Client) -> None:
    client.put("/taken", b"1")
    with pytest.raises(AlreadyExists):
        client.open("/taken", "xb")
    f = client.open("/race", "xb")
    f.write(b"mine")
    client.put("/race", b"theirs")
    with pytest.raises(AlreadyExists):
        f.close()
    assert client.get("/race") == b"theirs"


def test_text_and_append_modes_are_refused(client: Client) -> None:
    for mode in ("r", "w", "ab", "r+b"):
        with pytest.raises(InvalidArgument, match="binary"):
            client.open("/x", mode)  # type: ignore[call-overload]


def test_reader_is_a_real_binary_file(client: Client) -> None:
    data = blob(4 * SMALL_CHUNK + 99)
    client.put("/r", data)
    with client.open("/r") as f:
        assert isinstance(f, io.BufferedIOBase)
        assert f.readable() and f.seekable()
        assert f.read(10) == data[:10]
        assert f.tell() == 10
        f.seek(SMALL_CHUNK - 2)
        assert f.read(4) == data[SMALL_CHUNK - 2 : SMALL_CHUNK + 2]
        f.seek(-5, os.SEEK_END)
        assert f.read() == data[-5:]
        assert f.read(1) == b""
        f.seek(0)
        buf = bytearray(2 * SMALL_CHUNK)
        assert f.readinto(buf) == len(buf)
        assert bytes(buf) == data[: len(buf)]
        f.seek(0)
        assert f.read() == data
    assert f.closed


def test_reader_keeps_the_version_it_opened(client: Client) -> None:
    old = blob(2 * SMALL_CHUNK, seed=3)
    client.put("/v", old)
    with client.open("/v") as f:
        client.put("/v", blob(2 * SMALL_CHUNK, seed=5))
        assert f.read() == old


def test_sequential_small_reads_match(client: Client) -> None:
    data = blob(6 * SMALL_CHUNK + 1)
    client.put("/s", data)
    out = bytearray()
    with client.open("/s") as f:
        while piece := f.read(7777):
            out += piece
    assert out == data


# -- namespace ---------------------------------------------------------------


def test_ls_stat_exists(client: Client) -> None:
    client.put("/d/b", b"bb")
    client.put("/d/a", b"a")
    client.mkdir("/d/sub")
    names = [(i.name, i.kind, i.size) for i in client.ls("/d")]
    assert names == [("a", "file", 1), ("b", "file", 2), ("sub", "directory", 0)]
    assert [i.path for i in client.ls("/d/a")] == ["/d/a"]
    assert client.exists("/d/sub") and not client.exists("/d/zzz")
    assert client.stat("/").is_dir
    with pytest.raises(NotADirectory):
        client.stat("/d/a/x")


def test_mkdir_semantics(client: Client) -> None:
    client.mkdir("/a")
    with pytest.raises(AlreadyExists):
        client.mkdir("/a")
    client.mkdir("/a", exist_ok=True)
    with pytest.raises(NotFound):
        client.mkdir("/x/y")
    client.mkdir("/x/y/z", parents=True)
    assert client.stat("/x/y").is_dir
    client.put("/file", b"")
    with pytest.raises(AlreadyExists):
        client.mkdir("/file", exist_ok=True)


def test_rm_file_dir_and_recursive(client: Client) -> None:
    client.put("/t/a/1", b"1")
    client.put("/t/a/2", b"2")
    client.put("/t/b", b"3")
    with pytest.raises(DirectoryNotEmpty):
        client.rm("/t")
    client.rm("/t/b")
    assert not client.exists("/t/b")
    client.rm("/t", recursive=True)
    assert not client.exists("/t") and client.ls("/") == []
    with pytest.raises(NotFound):
        client.rm("/t")
    with pytest.raises(InvalidPath):
        client.rm("/", recursive=True)


def test_du_counts_files_and_bytes(client: Client) -> None:
    client.put("/u/a", b"12345")
    client.put("/u/x/b", b"123")
    client.put("/other", b"1")
    assert client.du("/u") == (2, 8)
    assert client.du("/") == (3, 9)


def test_rename_file_replaces_like_os_replace(client: Client) -> None:
    client.put("/a", b"A")
    client.put("/b", b"B")
    client.rename("/a", "/b")
    assert client.get("/b") == b"A" and not client.exists("/a")
    client.put("/c", b"C")
    with pytest.raises(AlreadyExists):
        client.rename("/c", "/b", replace=False)
    assert client.get("/b") == b"A"


def test_rename_directory_moves_the_tree(client: Client) -> None:
    for i in range(20):
        client.put(f"/ckpt/.staging/shard{i}", bytes([i]))
    info = client.rename("/ckpt/.staging", "/ckpt/step_100")
    assert info.is_dir
    assert not client.exists("/ckpt/.staging")
    assert len(client.ls("/ckpt/step_100")) == 20
    assert client.get("/ckpt/step_100/shard7") == bytes([7])


def test_rename_refusals(client: Client) -> None:
    client.put("/d/f", b"x")
    client.put("/e/g", b"y")
    client.mkdir("/empty")
    with pytest.raises(InvalidPath, match="into itself"):
        client.rename("/d", "/d/sub")
    with pytest.raises(DirectoryNotEmpty):
        client.rename("/d", "/e")
    with pytest.raises(IsADirectory):
        client.rename("/d/f", "/empty")
    with pytest.raises(NotADirectory):
        client.rename("/empty", "/d/f")
    with pytest.raises(NotFound):
        client.rename("/missing", "/x")
    client.rename("/d", "/empty")
    assert client.get("/empty/f") == b"x"


def test_errors_are_builtin_subclasses_with_errno(client: Client) -> None:
    client.put("/f", b"")
    cases = [
        (lambda: client.get("/nope"), FileNotFoundError, errno.ENOENT),
        (lambda: client.mkdir("/f"), FileExistsError, errno.EEXIST),
        (lambda: client.ls("/f/x"), NotADirectoryError, errno.ENOTDIR),
        (lambda: client.get("/"), IsADirectoryError, errno.EISDIR),
        (lambda: client.stat("/a\x00b"), ValueError, errno.EINVAL),
    ]
    for call, builtin, code in cases:
        with pytest.raises(GrabenError) as info:
            call()
        assert isinstance(info.value, builtin)
        assert info.value.errno == code


# -- async -------------------------------------------------------------------


def test_async_client_mirrors_the_sync_one(store_dir: Path) -> None:
    data = blob(3 * SMALL_CHUNK + 1)

    async def main() -> None:
        async with AsyncClient(store_dir, chunk_size=SMALL_CHUNK) as c:
            async with c.open("/a/x", "wb") as f:
                await f.write(data[:100])
                await f.write(data[100:])
            assert f.info is not None and f.info.size == len(data)
            async with c.open("/a/x") as r:
                assert await r.read(5) == data[:5]
                r.seek(SMALL_CHUNK)
                assert await r.read() == data[SMALL_CHUNK:]
            await c.put("/a/y", b"y")
            assert [i.name for i in await c.ls("/a")] == ["x", "y"]
            await c.rename("/a", "/b")
            assert await c.get("/b/y") == b"y"
            assert await c.get_range("/b/x", 1, 3) == data[1:3]
            await c.rm("/b", recursive=True)
            assert not await c.exists("/b")

    asyncio.run(main())


def test_many_threads_share_one_client(client: Client) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def work(i: int) -> bytes:
        data = blob(SMALL_CHUNK + i, seed=i + 1)
        client.put(f"/t/{i}", data)
        return client.get(f"/t/{i}") == data  # type: ignore[return-value]

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(32)))
    assert len(client.ls("/t")) == 32


def test_put_parts_stores_the_concatenation(client: Client) -> None:
    big = os.urandom(3 * SMALL_CHUNK + 5)
    parts = [b"head", memoryview(big), b"", bytearray(b"tail" * 10), big[:100]]
    info = client.put_parts("/parts", parts)
    whole = b"head" + big + b"tail" * 10 + big[:100]
    assert info.size == len(whole)
    assert client.get("/parts") == whole
    with pytest.raises(FileExistsError):
        client.put_parts("/parts", [b"x"], exclusive=True)


def test_put_parts_checked_gives_each_parts_crc32c(client: Client) -> None:
    big = os.urandom(3 * SMALL_CHUNK + 5)  # direct: several chunks, combined
    mid = os.urandom(70 * 1024)  # direct: one chunk
    parts = [b"head", memoryview(big), b"", mid, bytearray(b"tail" * 10)]
    info, sums = client.put_parts_checked("/checked", parts)
    assert sums == [crc32c.crc32c(bytes(p)) for p in parts]
    assert info.size == sum(len(p) for p in parts)
    _, [lone] = client.put_parts_checked("/lone", [b"only"])
    assert lone == crc32c.crc32c(b"only")


def test_put_parts_uploads_a_repeated_large_part_once(
    store_dir: Path, chunk_files: Callable[[], list[Path]]
) -> None:
    with connect(store_dir, chunk_size=SMALL_CHUNK) as client:
        tensor = os.urandom(2 * SMALL_CHUNK)
        client.put_parts("/step-1", [b"header one", tensor, b"trailer"])
        files = len(chunk_files())
        client.put_parts("/step-2", [b"another header", tensor, b"trailer 2"])
        added = len(chunk_files()) - files
        assert added <= 2  # the two small packed chunks, not the large part's two
        assert client.get("/step-2") == b"another header" + tensor + b"trailer 2"


def test_rename_replace_tree_swaps_a_whole_directory(client: Client) -> None:
    client.put("/old/a", b"1")
    client.put("/old/deep/b", b"2")
    client.put("/new/c", b"3")
    with pytest.raises(OSError, match="not empty"):
        client.rename("/new", "/old")
    client.rename("/new", "/old", replace_tree=True)
    assert [e.path for e in client.ls("/old")] == ["/old/c"]
    assert not client.exists("/new")
    client.put("/taken/x", b"")
    with pytest.raises(FileExistsError):
        client.rename("/old", "/taken", replace=False)
    assert client.get("/taken/x") == b""


def test_set_attributes_changes_mode_and_mtime_in_place(client: Client) -> None:
    client.put("/attr/f", b"data")
    client.mkdir("/attr/d")
    info = client.set_attributes("/attr/f", mode=0o600, mtime_ns=1_000_000_000)
    assert (info.mode, info.mtime_ns) == (0o600, 1_000_000_000)
    assert client.stat("/attr/f").mode == 0o600
    assert client.get("/attr/f") == b"data"
    assert client.set_attributes("/attr/d", mode=0o700).mode == 0o700
    assert client.stat("/attr/d").is_dir
    with pytest.raises(NotFound):
        client.set_attributes("/attr/missing", mode=0o600)
    with pytest.raises(InvalidArgument):
        client.set_attributes("/attr/d", mode=0o17777)
    assert client.set_attributes("/", mode=0o1777).mode == 0o1777  # the root too (rsync -a)
    assert client.set_attributes("/", mode=0o755).mode == 0o755


def test_owners_links_and_special_files_through_the_client(client: Client) -> None:
    made = client.put("/own/f", b"data", attributes=Change(uid=7, gid=8, mtime_ns=1000))
    assert (made.uid, made.gid, made.mtime_ns) == (7, 8, 1000)
    assert client.put("/own/f", b"more").uid == 7  # a new version keeps its owner
    changed = client.set_attributes("/own/f", uid=9, atime_ns=5)
    assert (changed.uid, changed.gid, changed.atime_ns) == (9, 8, 5)
    assert client.mkdir("/own/d", mode=0o700, uid=3, gid=4).mode == 0o700
    assert client.link("/own/f", "/own/d/g").nlink == 2
    assert client.get("/own/d/g") == b"more"
    fifo = client.mknod("/own/fifo", stat.S_IFIFO | 0o600)
    assert stat.S_ISFIFO(fifo.mode) and client.get("/own/fifo") == b""
    with pytest.raises(FileExistsError):
        client.mknod("/own/fifo", stat.S_IFIFO | 0o600)
    assert client.put("/own/zero", b"", permissions=0).mode == 0
    assert client.stat("/own").nlink == 3


def test_submit_runs_an_async_call_on_the_clients_loop_without_waiting(client: Client) -> None:
    client.put("/submit/f", b"abc")
    future = client.submit(lambda aio: aio.stat("/submit/f"))
    assert future.result(timeout=30).size == 3
    with pytest.raises(NotFound):
        client.submit(lambda aio: aio.stat("/submit/missing")).result(timeout=30)


def test_stat_from_many_short_lived_threads_keeps_few_descriptors(client: Client) -> None:
    """An embedded store answers ``stat`` in the calling thread: the connections of
    threads that ended are closed, not kept."""
    client.put("/threads/f", b"x")

    def one() -> None:
        assert client.stat("/threads/f").size == 1

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    one()
    before = fds()
    for _ in range(200):
        thread = threading.Thread(target=one)
        thread.start()
        thread.join()
    assert fds() < before + 10


def test_a_new_version_keeps_the_mode_unless_told(client: Client) -> None:
    assert client.put("/perm/f", b"one").mode == 0o644
    client.set_attributes("/perm/f", mode=0o750)
    assert client.put("/perm/f", b"two").mode == 0o750
    assert client.put("/perm/f", b"three", permissions=0o600).mode == 0o600
    assert client.put("/perm/g", b"new", permissions=0o700).mode == 0o700
