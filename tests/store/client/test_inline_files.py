"""Small files kept by the metadata engine, through the client, on both kinds of store:
no node write, read back checked, grown into chunks and shrunk back, off when asked."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster_kit import three_nodes

from graben.store import Client, IntegrityError, connect
from graben.store._types import FileLayout
from graben.store.client import _loop, _parts
from graben.store.transport import GetLayout


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A cluster of this module's own: its tests fsck the whole cluster (see tests/conftest.py)."""
    with three_nodes(tmp_path_factory) as url:
        yield url


def layout(client: Client, path: str) -> FileLayout:
    """The file's layout as the store serves it."""
    found: FileLayout = _loop.run(client.aio.meta.request(GetLayout(path)))
    return found


def test_a_small_file_goes_to_the_engine_alone(client: Client) -> None:
    client.put("/d/small", b"s" * 5000)
    client.put("/d/large", b"l" * 200_000)
    small, large = layout(client, "/d/small"), layout(client, "/d/large")
    assert small.replicas == {} and list(small.inline.values()) == [b"s" * 5000]
    assert large.inline == {} and all(large.replicas.values())
    assert client.get("/d/small") == b"s" * 5000
    assert client.get_range("/d/small", 4990, 5010) == b"s" * 10
    with client.open("/d/small") as f:
        assert f.read(3) == b"sss" and f.read() == b"s" * 4997
    assert client.du("/d") == (2, 205_000)
    assert client.fsck().ok


def test_a_file_grows_into_chunks_and_shrinks_back(client: Client) -> None:
    for size in (1000, 300_000, 10, 0, 64 * 1024, 64 * 1024 + 1, 7):
        data = bytes([size % 251]) * size
        with client.open("/f", "wb") as f:
            for start in range(0, size, 4096):  # as a mount writes: small pieces
                f.write(data[start : start + 4096])
        kept = layout(client, "/f")
        assert bool(kept.inline) == (0 < size <= 64 * 1024), size
        assert client.get("/f") == data
    client.copy("/f", "/g")
    assert client.get("/g") == b"\x07" * 7 and layout(client, "/g").inline


def test_a_larger_file_reuses_a_chunk_the_engine_keeps(client: Client) -> None:
    with connect(client.aio.name, chunk_size=4096) as c:
        first, second = b"a" * 4096, b"b" * 4096
        c.put("/small", first)
        c.put("/large", first + second)  # its first chunk is /small's: not sent to a node
        kept = layout(c, "/large")
        assert list(kept.inline.values()) == [first] and len(kept.replicas) == 1
        assert c.get("/large") == first + second
        c.rm("/small")
        assert c.get("/large") == first + second
        assert c.fsck().ok and c.health().degraded == 0


def test_a_client_may_keep_its_small_files_on_the_nodes(client: Client) -> None:
    with connect(client.aio.name, inline_max=0, chunk_size=client.aio.options.chunk_size) as c:
        c.put("/n", b"tiny")
        assert layout(c, "/n").inline == {} and layout(c, "/n").replicas
    with connect(client.aio.name, inline_max=10) as c:
        c.put("/eleven", b"x" * 11)
        c.put("/ten", b"x" * 10)
        assert not layout(c, "/eleven").inline and layout(c, "/ten").inline


def test_a_transaction_of_many_small_files_carries_a_bounded_share_inline(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_parts, "COMMIT_INLINE_MAX", 3000)
    files = []
    for i in range(5):
        with client.open(f"/t/{i}", "wb", autocommit=False) as f:
            f.write(bytes([i]) * 1000)
        files.append(f)  # closed before its transaction commits
    client.commit_uploads([f.upload for f in files])
    kept = [bool(layout(client, f"/t/{i}").inline) for i in range(5)]
    assert kept == [True, True, True, False, False]
    assert [client.get(f"/t/{i}") for i in range(5)] == [bytes([i]) * 1000 for i in range(5)]


def test_damaged_kept_bytes_are_found_by_fsck_and_never_read(
    store_dir: Path, chunk_files: Callable[[], list[Path]]
) -> None:
    with connect(store_dir) as c:
        c.put("/ckpt/meta.json", b'{"step": 100}')
        assert chunk_files() == []  # nothing on the node: the engine keeps it
    db = sqlite3.connect(store_dir / "meta.db")
    db.execute("UPDATE chunk_bytes SET data = ?", (b'{"step": 900}',))
    db.commit()
    db.close()
    with connect(store_dir) as c:
        with pytest.raises(IntegrityError, match="checksum"):
            c.get("/ckpt/meta.json")
        report = c.fsck()
    (problem,) = report.problems
    assert (problem.kind, problem.paths) == ("corrupt", ("/ckpt/meta.json",))
    assert not report.ok
