"""Chunks are content-addressed: bytes that do not hash to their id are never stored or trusted.

The forgeries here keep the length and the crc32c of the real chunk (crc32c
is linear, so four chosen bytes fix it), which is all a crc32c check sees.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, eventually
from fuse_kit import mounted
from store_kit import SMALL_CHUNK

from graben.store import IntegrityError, PermissionDenied, connect
from graben.store._hashing import chunk_ref, crc32c
from graben.store._types import ChunkRef
from graben.store.client import _loop
from graben.store.node._chunkstore import LocalChunkStore
from graben.store.transport import ChunkCall
from graben.store.transport._requests import GetLayout, Grant
from graben.store.wire._auth import grant, load_secret
from graben.store.wire._frames import encode
from graben.store.wire._rpc import Connection


def forge(real: bytes) -> bytes:
    """Other bytes of the same length and crc32c as ``real``."""
    forged = bytearray(os.urandom(len(real)))
    base = crc32c(forged)
    columns = []  # what flipping each bit of the last four bytes does to the crc
    for bit in range(32):
        forged[-4 + bit // 8] ^= 1 << (bit % 8)
        columns.append(crc32c(forged) ^ base)
        forged[-4 + bit // 8] ^= 1 << (bit % 8)
    flips = _solve(columns, base ^ crc32c(real))
    for bit in range(32):
        if flips >> bit & 1:
            forged[-4 + bit // 8] ^= 1 << (bit % 8)
    assert crc32c(forged) == crc32c(real) and bytes(forged) != real
    return bytes(forged)


def _solve(columns: list[int], target: int) -> int:
    """The bits ``x`` with XOR of ``columns[i]`` for each set bit ``i`` of ``x`` == ``target``."""
    basis: dict[int, tuple[int, int]] = {}  # top bit -> (value, which bits make it)
    for i, column in enumerate(columns):
        value, made = column, 1 << i
        for top in sorted(basis, reverse=True):
            if value >> top & 1:
                value, made = value ^ basis[top][0], made ^ basis[top][1]
        if value:
            basis[value.bit_length() - 1] = (value, made)
    chosen = 0
    for top in sorted(basis, reverse=True):
        if target >> top & 1:
            target ^= basis[top][0]
            chosen ^= basis[top][1]
    assert target == 0
    return chosen


def _chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("**/chunks/??/??/*") if p.is_file())


# -- embedded ---------------------------------------------------------------------------


def test_the_chunk_store_refuses_bytes_that_do_not_hash_to_the_id(tmp_path: Path) -> None:
    store = LocalChunkStore(tmp_path / "chunks")
    try:
        real = os.urandom(100_000)
        ref = chunk_ref(real)
        forged = forge(real)
        with pytest.raises(IntegrityError, match="blake3"):
            store.write(ref, memoryview(forged))
        assert not store.path(ref.id).exists()
        store.write(ref, memoryview(real))
        for write in (store.write, lambda r, d: _only(store.write_group([(r, d)]))):
            with pytest.raises(IntegrityError, match="blake3"):
                write(ref, memoryview(forged))
            assert store.path(ref.id).read_bytes() == real  # never replaced
    finally:
        store.close()


def _only(errors: list[IntegrityError | None]) -> None:
    if errors[0] is not None:
        raise errors[0]


def test_embedded_fsck_finds_a_forged_copy(tmp_path: Path) -> None:
    root = tmp_path / "s"
    with connect(root, chunk_size=SMALL_CHUNK) as client:
        data = os.urandom(3 * SMALL_CHUNK)
        client.put("/f", data)
        victim = _chunk_files(root)[1]
        victim.write_bytes(forge(victim.read_bytes()))
        report = client.fsck()
        assert not report.ok
        [problem] = report.problems
        assert (problem.kind, problem.chunk, problem.paths) == ("corrupt", victim.name, ("/f",))
        assert "blake3" in problem.detail


# -- a cluster --------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, nodes=3)
    try:
        yield cluster
    finally:
        cluster.close()


def _write(address: str, chunk: ChunkRef, cap: object, data: bytes) -> None:
    async def go() -> None:
        host, _, port = address.rpartition(":")
        conn = await Connection.open(host, int(port))
        try:
            body = encode(ChunkCall(chunk, cap))  # type: ignore[arg-type]
            await conn.call("chunk.write", body, payload=memoryview(data))
        finally:
            await conn.close()

    _loop.run(go())


# The attacks below are on the nodes' copies: the files are kept off the engine.


def test_a_live_chunk_is_not_writable_and_forged_bytes_are_refused(cluster: LocalCluster) -> None:
    data = os.urandom(SMALL_CHUNK)
    with connect(cluster.url, inline_max=0) as client:
        client.put("/live", data)
        layout = _loop.run(client.aio.meta.request(GetLayout("/live")))
        chunk = layout.extents[0].chunk
        with pytest.raises(PermissionDenied, match="in use"):
            _loop.run(client.aio.meta.request(Grant((chunk.id,), "write")))
        nodes = {n.id: n.address for n in client.health().nodes}
        store_id = client.health().store_id
        # Someone holding the secret itself can still mint a write capability:
        # the node checks the bytes against the id anyway.
        cap = grant(load_secret(), chunk.id, "write", 60, time.time(), store=store_id)
        before = {p: p.read_bytes() for p in _chunk_files(cluster.root)}
        for node in layout.replicas[chunk.id]:
            with pytest.raises(IntegrityError, match="blake3"):
                _write(nodes[node], chunk, cap, forge(data))
        assert {p: p.read_bytes() for p in _chunk_files(cluster.root)} == before
        assert client.get("/live") == data


def test_fsck_finds_a_forged_copy_on_a_node(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=3)
    try:
        data = os.urandom(SMALL_CHUNK)
        with connect(cluster.url, inline_max=0) as client:
            client.put("/f", data)
            victim = _chunk_files(cluster.root)[0]
            victim.write_bytes(forge(data))
            report = client.fsck()
            assert [(p.kind, p.chunk, p.paths) for p in report.problems] == [
                ("corrupt", victim.name, ("/f",))
            ]
            assert "blake3" in report.problems[0].detail
            assert client.get("/f") == data
    finally:
        cluster.close()


def test_the_scrubber_finds_a_forged_copy_and_repair_replaces_it(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=3, repair=0.5, scrub=0.5)
    try:
        data = os.urandom(SMALL_CHUNK)
        with connect(cluster.url, inline_max=0) as client:
            client.put("/f", data)
        victim = _chunk_files(cluster.root)[0]
        victim.write_bytes(forge(data))
        eventually(lambda: victim.exists() and victim.read_bytes() == data)
        with connect(cluster.url, inline_max=0) as client:
            assert not client.fsck().problems
    finally:
        cluster.close()


def _copies(client: object, path: str) -> list[int]:
    layout = _loop.run(client.aio.meta.request(GetLayout(path)))  # type: ignore[attr-defined]
    return [len(layout.replicas[x.chunk.id]) for x in layout.extents]


def test_min_replicas_holds_for_bytes_the_store_has_already(cluster: LocalCluster) -> None:
    """Content held twice, written again asking for three copies: the third is made."""
    data = os.urandom(3 * SMALL_CHUNK)
    with connect(cluster.url, chunk_size=SMALL_CHUNK, inline_max=0) as client:
        client.put("/twice", data, replication=2)
        assert _copies(client, "/twice") == [2, 2, 2]
        client.put("/thrice", data, replication=3, min_replicas=3)
        assert _copies(client, "/thrice") == [3, 3, 3]
        assert _copies(client, "/twice") == [3, 3, 3]  # the same chunks
        client.put("/again", data, replication=3, min_replicas=2)  # enough: nothing sent
        assert client.get("/again") == data
    assert len(_chunk_files(cluster.root)) == 9


def _first_copy(cluster: LocalCluster, client: object, path: str) -> tuple[Path, bytes]:
    """The chunk file a reader of ``path`` (one chunk) asks for first, and its bytes."""
    layout = _loop.run(client.aio.meta.request(GetLayout(path)))  # type: ignore[attr-defined]
    chunk = layout.extents[0].chunk.id
    first = layout.replicas[chunk][0]
    for i in range(len(cluster.nodes)):
        if (cluster.node_dir(i) / "node-id").read_text().strip() == first:
            victim = cluster.node_dir(i) / "chunks" / chunk[:2] / chunk[2:4] / chunk
            return victim, victim.read_bytes()
    raise AssertionError(f"no node {first}")


def test_a_copy_rewritten_with_its_crc32c_is_refused_on_read_and_repaired(
    tmp_path: Path,
) -> None:
    """Readers check blake3, not just crc32c: the forged copy is reported, another is read,
    and repair puts the right bytes back (through the API and the mount)."""
    cluster = LocalCluster(tmp_path / "c", nodes=3, repair=0.5)
    try:
        data = os.urandom(SMALL_CHUNK)
        with connect(cluster.url, inline_max=0) as client:
            client.put("/f", data)
            victim, good = _first_copy(cluster, client, "/f")
        assert good == data
        victim.write_bytes(forge(data))
        with connect(cluster.url, read_check="crc32c") as trusting:
            assert trusting.get("/f") != data  # what a crc32c-only reader is served
        with connect(cluster.url) as client:
            assert client.get("/f") == data
        eventually(lambda: victim.exists() and victim.read_bytes() == data)  # reported, repaired
        victim.write_bytes(forge(data))
        with mounted(cluster.url, tmp_path / "m") as point:
            assert (point / "f").read_bytes() == data
        eventually(lambda: victim.exists() and victim.read_bytes() == data)
    finally:
        cluster.close()


def test_a_crc32c_reader_is_served_a_forged_copy_as_the_promises_say(tmp_path: Path) -> None:
    """``read_check="crc32c"`` weakens its own reader's check only, a tenant's too (the
    decision docs/promises.md states): that reader is served a copy forged to match the
    crc32c, a default (blake3) reader of the same file with the same token is not."""
    cluster = LocalCluster(tmp_path / "c", nodes=3, repair=3600)
    try:
        data = os.urandom(SMALL_CHUNK)
        with connect(cluster.url, inline_max=0) as operator:
            operator.add_tenant("a", "/a")
            token = operator.issue_token("a", rights="r", ttl_s=600)
            operator.put("/a/f", data)
            victim, _ = _first_copy(cluster, operator, "/a/f")
        victim.write_bytes(forge(data))
        with connect(cluster.url, token=token, read_check="crc32c") as trusting:
            assert trusting.get("/a/f") != data
        with connect(cluster.url, token=token) as checking:
            assert checking.get("/a/f") == data
    finally:
        cluster.close()
    promises = (Path(__file__).parents[3] / "docs" / "promises.md").read_text()
    bullet = promises.split("**Data is what was written.**")[1].split("\n- **")[0]
    assert 'read_check="crc32c"' in bullet and "forged" in bullet, bullet


def test_a_forked_worker_reads_what_its_parent_read(cluster: LocalCluster) -> None:
    """DataLoader workers are forked from a process that has read (and hashed) already:
    nothing in the read path may hang in the child (Rayon's pool did)."""
    data = os.urandom(3 * SMALL_CHUNK)
    with connect(cluster.url, chunk_size=SMALL_CHUNK) as client:
        client.put("/shared", data)
        assert client.get("/shared") == data
    pid = os.fork()
    if pid == 0:  # the child: a fresh client, as a worker makes
        code = 1
        try:
            with connect(cluster.url) as child:
                code = 0 if child.get("/shared") == data else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked reader hung")
        time.sleep(0.1)
    assert os.waitstatus_to_exitcode(done[1]) == 0
