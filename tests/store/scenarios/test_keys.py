"""An idempotency key is bound to its request: sent again with another, it fails that
request alone, never the other clients' commits that share its group transaction."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster

from graben.store import AsyncClient, InvalidArgument, connect
from graben.store._types import FileCommit
from graben.store.client import _loop
from graben.store.transport import Commit, MakeDir, Remove


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("keys"), nodes=1, replication=1)
    try:
        yield cluster
    finally:
        cluster.close()


async def _staged(client: AsyncClient, path: str, data: bytes) -> FileCommit:
    """What committing ``path`` with ``data`` sends (its chunks stored, nothing visible)."""
    upload = await client._open_upload(path)
    await upload.add(memoryview(data))
    return await upload.finish()


def test_a_key_sent_again_with_another_request_is_refused(cluster: LocalCluster) -> None:
    key = os.urandom(16).hex()
    with connect(cluster.url) as client:
        meta = client.aio.meta
        client.put("/victim", b"v")
        assert _loop.run(meta.request(Remove("/victim", key=key))) == 1
        assert _loop.run(meta.request(Remove("/victim", key=key))) == 1  # a retry: replayed
        staged = _loop.run(_staged(client.aio, "/other", b"other"))
        with pytest.raises(InvalidArgument, match="another request"):
            _loop.run(meta.request(Commit((staged,), key=key)))
        with pytest.raises(InvalidArgument, match="another request"):
            _loop.run(meta.request(MakeDir("/d", key=key)))
        assert not client.exists("/other") and not client.exists("/d")
        assert _loop.run(meta.request(Commit((staged,), key=os.urandom(16).hex())))
        assert client.get("/other") == b"other"


def test_a_reused_key_never_fails_the_commits_grouped_with_it(cluster: LocalCluster) -> None:
    """One client keeps sending commits under a key already spent on a Remove while
    others put files: their commits share group transactions with the bad ones."""
    key = os.urandom(16).hex()
    stop, abusing = threading.Event(), threading.Event()
    refused: list[int] = []
    failed: list[BaseException] = []

    def abuse() -> None:
        try:
            with connect(cluster.url) as client:
                client.put("/spent", b"s")
                _loop.run(client.aio.meta.request(Remove("/spent", key=key)))
                staged = _loop.run(_staged(client.aio, "/abuse", b"abuse"))
                while not stop.is_set():
                    try:
                        _loop.run(client.aio.meta.request(Commit((staged,), key=key)))
                    except InvalidArgument:
                        refused.append(1)
                        abusing.set()
        except BaseException as exc:
            failed.append(exc)
            abusing.set()

    def honest(i: int) -> None:
        with connect(cluster.url) as client:
            for j in range(60):
                client.put(f"/honest/{i}/{j}", f"{i}-{j}".encode())

    bad = threading.Thread(target=abuse)
    bad.start()
    try:
        assert abusing.wait(60)  # the bad commits are under way before the good ones start
        writers = [threading.Thread(target=honest, args=(i,)) for i in range(6)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
    finally:
        stop.set()
        bad.join()
    assert not failed, failed
    assert refused
    with connect(cluster.url) as client:
        for i in range(6):
            assert len(client.ls(f"/honest/{i}")) == 60
            assert client.get(f"/honest/{i}/59") == f"{i}-59".encode()
        assert not client.exists("/abuse")


def test_a_key_must_be_a_plain_token(cluster: LocalCluster) -> None:
    with connect(cluster.url) as client:
        for bad in ("two words", "x" * 200, "tab\there"):
            with pytest.raises(InvalidArgument, match="idempotency key"):
                _loop.run(client.aio.meta.request(MakeDir("/k", key=bad)))
        assert not client.exists("/k")


def test_an_embedded_store_binds_keys_too(tmp_path: Path) -> None:
    key = os.urandom(16).hex()
    with connect(tmp_path / "s") as client:
        client.put("/f", b"f")
        assert _loop.run(client.aio.meta.request(Remove("/f", key=key))) == 1
        with pytest.raises(InvalidArgument, match="another request"):
            _loop.run(client.aio.meta.request(MakeDir("/d", key=key)))
