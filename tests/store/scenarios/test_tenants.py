"""Tenants on a real cluster: two metadata services on one engine, three data nodes.

A token for /teams/a reaches /teams/a and nothing of /teams/b, through the API,
fsspec, the CLI, DCP and datasets (the mount's own test is in tests/fuse); a
capability of its own does not read b's chunks from a node; a revoked token is
refused by every service within a second; quotas hold under 16 writers at once,
and a ``rm`` gives back what it freed.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from cluster_kit import LocalCluster, eventually

from graben.store import Client, PermissionDenied, QuotaExceeded, connect
from graben.store.client import _loop
from graben.store.meta._grants import TENANT_TTL_S
from graben.store.transport import ChunkRefs, Grant, ListNodes
from graben.store.transport._requests import GetLayout

MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("tenants"), 3, replication=2, metas=2)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster) -> Iterator[Client]:
    with connect(cluster.url) as client:
        client.add_tenant("a", "/teams/a")
        client.add_tenant("b", "/teams/b")
        client.put("/teams/b/secret.bin", b"b's weights " * 10_000)
        yield client


@pytest.fixture(scope="module")
def token_a(operator: Client) -> str:
    return operator.issue_token("a", rights="rw", ttl_s=3600)


@pytest.fixture(scope="module")
def team_a(cluster: LocalCluster, token_a: str) -> Iterator[Client]:
    with connect(cluster.url, token=token_a) as client:
        yield client


def test_a_token_reaches_its_prefix_and_sees_the_way_to_it(team_a: Client) -> None:
    team_a.put("/teams/a/model.pt", b"a's weights" * 50_000)
    assert team_a.get("/teams/a/model.pt") == b"a's weights" * 50_000
    assert [e.name for e in team_a.ls("/")] == ["teams"]
    assert [e.name for e in team_a.ls("/teams")] == ["a"]
    assert team_a.stat("/teams").is_dir


@pytest.mark.parametrize(
    "attempt",
    [
        lambda c: c.stat("/teams/b/secret.bin"),
        lambda c: c.ls("/teams/b"),
        lambda c: c.get("/teams/b/secret.bin"),
        lambda c: c.put("/teams/b/planted", b"x"),
        lambda c: c.rm("/teams/b", recursive=True),
        lambda c: c.rename("/teams/a/model.pt", "/teams/b/model.pt"),
        lambda c: c.mkdir("/teams/b/sub"),
        lambda c: c.du("/teams/b"),
        lambda c: c.set_class("/teams/a", "ec:2+1"),  # no admin right
        lambda c: c.rm("/teams/a", recursive=True),  # its own root is the operator's
        lambda c: c.tenants(),
        lambda c: c.issue_token("a", rights="rwa"),
        lambda c: c.health(),
        lambda c: c.set_quota("/teams/a", max_bytes=1 << 40),
    ],
    ids=lambda _: "",
)
def test_a_token_for_a_cannot_touch_b_nor_the_operators_requests(
    team_a: Client, operator: Client, attempt: object
) -> None:
    with pytest.raises(PermissionDenied) as refused:
        attempt(team_a)  # type: ignore[operator]
    assert "gbt_" not in str(refused.value)
    assert operator.get("/teams/b/secret.bin") == b"b's weights " * 10_000
    assert [e.name for e in operator.ls("/teams/b")] == ["secret.bin"]


def test_a_capability_of_its_own_does_not_read_bs_chunks(
    cluster: LocalCluster, team_a: Client, operator: Client
) -> None:
    theirs = _loop.run(operator.aio.meta.request(GetLayout("/teams/b/secret.bin")))
    chunk = theirs.extents[0].chunk
    with pytest.raises(PermissionDenied):
        _loop.run(team_a.aio.meta.request(Grant((chunk.id,), "read")))
    with pytest.raises(PermissionDenied):  # nor a delete of anything
        _loop.run(team_a.aio.meta.request(Grant((chunk.id,), "delete")))
    with pytest.raises(PermissionDenied):  # nor page through every chunk (fsck's)
        _loop.run(team_a.aio.meta.request(ChunkRefs()))
    mine = _loop.run(team_a.aio.meta.request(GetLayout("/teams/a/model.pt")))
    own = mine.grants[mine.extents[0].chunk.id]
    node = theirs.replicas[chunk.id][0]
    grants = team_a.aio.meta.grants  # type: ignore[attr-defined]
    grants._held[(chunk.id, "read")] = (own, float("inf"))  # its own, shown for b's chunk
    with pytest.raises(PermissionDenied, match="another chunk"):
        _loop.run(team_a.aio.chunks.read(node, chunk, memoryview(bytearray(chunk.length))))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_a_token_says_what_it_reaches(
    cluster: LocalCluster, operator: Client, team_a: Client, tmp_path: Path
) -> None:
    """``whoami``: what a mount needs to refuse at open a write the store would refuse."""
    me = team_a.whoami()
    assert me is not None and (me.tenant, me.prefix, me.rights) == ("a", "/teams/a", "rw")
    assert me.expires > time.time()
    reader = operator.issue_token("a", prefix="/teams/a/shared", rights="r", ttl_s=600)
    with connect(cluster.url, token=reader) as client:
        me = client.whoami()
        assert me is not None and (me.prefix, me.rights) == ("/teams/a/shared", "r")
    assert operator.whoami() is None  # the cluster's own token: everything
    with connect(tmp_path / "embedded") as embedded:
        embedded.mkdir("/made")
        assert embedded.whoami() is None


def test_rights_are_what_the_token_was_given(cluster: LocalCluster, operator: Client) -> None:
    writer = operator.issue_token("a", rights="w", ttl_s=600)
    admin = operator.issue_token("a", prefix="/teams/a", rights="rwa", ttl_s=600)
    with connect(cluster.url, token=writer) as client:
        client.put("/teams/a/dropped", b"x")
        for attempt in (lambda: client.ls("/teams/a"), lambda: client.get("/teams/a/dropped")):
            with pytest.raises(PermissionDenied, match="has no read right"):
                attempt()
    with connect(cluster.url, token=admin) as client:
        client.mkdir("/teams/a/ec")
        assert client.set_class("/teams/a/ec", "ec:2+1") == "ec:2+1"
        client.set_quota("/teams/a/ec", max_files=10)
        with pytest.raises(PermissionDenied, match="not it"):  # its root's quota: the operator's
            client.set_quota("/teams/a", max_bytes=1 << 50)


def test_a_tenant_reads_its_erasure_coded_files_as_their_grants_run_out(
    cluster: LocalCluster, operator: Client, team_a: Client
) -> None:
    operator.mkdir("/teams/a/coded", exist_ok=True)
    operator.set_class("/teams/a/coded", "ec:2+1")
    data = os.urandom(3 * MiB)
    team_a.put("/teams/a/coded/f", data)
    converted = lambda: team_a.storage_class("/teams/a/coded/f").converted == 1  # noqa: E731
    eventually(converted, 60)
    layout = _loop.run(team_a.aio.meta.request(GetLayout("/teams/a/coded/f")))
    pieces = tuple(p.id for stripe in layout.stripes.values() for p in stripe.pieces)
    assert len(pieces) == 3
    fresh = _loop.run(team_a.aio.meta.request(Grant(pieces, "read")))  # as after 10 minutes
    assert {c.chunk for c in fresh} == set(pieces)
    with pytest.raises(PermissionDenied):
        _loop.run(team_a.aio.meta.request(Grant(("0" * 64,), "read")))
    assert team_a.get("/teams/a/coded/f") == data


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_fsspec_the_cli_dcp_and_datasets_carry_the_token(
    cluster: LocalCluster, token_a: str, tmp_path: Path
) -> None:
    fs = fsspec.filesystem("graben", url=cluster.url, token=token_a, skip_instance_cache=True)
    fs.pipe("/teams/a/table.csv", b"x,y\n1,2\n")
    assert fs.cat("/teams/a/table.csv") == b"x,y\n1,2\n"
    for refused in (
        lambda: fs.ls("/teams/b"),
        lambda: fs.cat("/teams/b/secret.bin"),
        lambda: fs.pipe("/teams/b/p", b"x"),
        lambda: fs.info("/teams/b/secret.bin"),
    ):
        with pytest.raises(PermissionDenied):
            refused()

    token_file = tmp_path / "a.token"
    token_file.write_text(token_a + "\n")
    token_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRABEN_SECRET")}
    env["GRABEN_TOKEN_FILE"] = str(token_file)
    cli = [sys.executable, "-m", "graben.store.cli", "ls", "--store", cluster.url]
    mine = subprocess.run([*cli, "/teams/a"], env=env, capture_output=True, text=True, check=False)
    assert mine.returncode == 0 and "table.csv" in mine.stdout
    theirs = subprocess.run(
        [*cli, "/teams/b"], env=env, capture_output=True, text=True, check=False
    )
    assert theirs.returncode == 1
    assert "reaches /teams/a only" in theirs.stderr and token_a[20:] not in theirs.stderr
    token_file.chmod(0o644)
    loose = subprocess.run([*cli, "/teams/a"], env=env, capture_output=True, text=True, check=False)
    assert loose.returncode != 0 and "chmod 600" in loose.stderr

    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from graben.checkpoint import GrabenReader, GrabenWriter
    from graben.dataloader import CachedDataset, write_dataset

    with connect(cluster.url, token=token_a) as client:
        state = {"w": torch.arange(1000.0)}
        dcp.save(state, storage_writer=GrabenWriter("/teams/a/ckpt/1", client=client), no_dist=True)
        back = {"w": torch.zeros(1000)}
        dcp.load(back, storage_reader=GrabenReader("/teams/a/ckpt/1", client=client), no_dist=True)
        assert torch.equal(back["w"], state["w"])
        with pytest.raises(CheckpointException) as caught:  # DCP wraps each rank's error
            theirs = GrabenWriter("/teams/b/ckpt/1", client=client)
            dcp.save(state, storage_writer=theirs, no_dist=True)
        assert "reaches /teams/a only" in repr(caught.value.failures)
    options = {"token": token_a}
    rows = [{"i": i} for i in range(100)]
    write_dataset(f"{cluster.url}/teams/a/ds", rows, storage_options=options)
    data = CachedDataset(
        f"{cluster.url}/teams/a/ds", storage_options=options, cache_dir=tmp_path / "c"
    )
    assert sorted(r["i"] for r in data) == list(range(100))
    with pytest.raises(PermissionDenied):
        write_dataset(f"{cluster.url}/teams/b/ds", rows, storage_options=options)
    with pytest.raises(PermissionDenied):
        CachedDataset(
            f"{cluster.url}/teams/b/ds", storage_options=options, cache_dir=tmp_path / "d"
        )


def test_a_revoked_token_is_refused_by_every_service_within_a_second(
    cluster: LocalCluster, operator: Client
) -> None:
    token = operator.issue_token("a", prefix="/teams/a", rights="r", ttl_s=600)
    ident = token.split("_")[1]
    each = [connect(f"graben://{a}", token=token) for a in cluster.meta_addresses]
    try:
        for client in each:
            client.stat("/teams/a")  # known, and cached, on both services
        with connect(f"graben://{cluster.meta_addresses[0]}") as first:
            assert first.revoke_tokens(ident) == 1
        revoked = time.monotonic()
        for client in each:
            while _served(client):
                assert time.monotonic() - revoked < 1.0, "still served after 1 s"
                time.sleep(0.02)
            with pytest.raises(PermissionDenied, match=f"token {ident} was revoked"):
                client.stat("/teams/a")
        assert [t.revoked for t in operator.tokens("a") if t.id == ident] == [True]
    finally:
        for client in each:
            client.close()


def test_a_read_handle_stops_reading_within_a_capabilitys_life_after_revocation(
    cluster: LocalCluster, operator: Client
) -> None:
    data = os.urandom(64 * 64 * 1024)  # 64 chunks: each read below goes to a node
    with connect(cluster.url, chunk_size=64 * 1024) as writer:
        writer.put("/teams/a/handle.bin", data)
    token = operator.issue_token("a", rights="r", ttl_s=600)
    with connect(cluster.url, token=token, chunk_size=64 * 1024) as client:
        handle = client.open("/teams/a/handle.bin")
        assert handle.read(1000) == data[:1000]
        operator.revoke_tokens(token.split("_")[1])
        revoked, turn = time.monotonic(), 0
        with pytest.raises(PermissionDenied):
            while time.monotonic() - revoked < 3 * TENANT_TTL_S:
                turn = (turn + 7) % 64  # another chunk each time: nothing cached serves it
                handle.seek(turn * 64 * 1024)
                assert handle.read(1000) == data[turn * 64 * 1024 :][:1000]
                time.sleep(0.1)
        assert time.monotonic() - revoked <= TENANT_TTL_S + 1.0
        handle.close()


def test_a_tenant_sees_where_the_nodes_are_not_their_disks(
    team_a: Client, operator: Client
) -> None:
    theirs = _loop.run(team_a.aio.meta.request(ListNodes()))
    ours = _loop.run(operator.aio.meta.request(ListNodes()))
    assert sorted(n.address for n in theirs) == sorted(n.address for n in ours)
    assert all(n.free == n.total == 0 and n.rack == "" for n in theirs)
    assert all(n.total > 0 for n in ours)


def test_an_expired_token_is_refused(cluster: LocalCluster, operator: Client) -> None:
    token = operator.issue_token("a", rights="r", ttl_s=1)
    with connect(cluster.url, token=token) as client:
        client.stat("/teams/a")
        time.sleep(1.1)
        with pytest.raises(PermissionDenied, match="expired"):
            client.stat("/teams/a")


def test_the_servers_logs_never_hold_a_token(cluster: LocalCluster, token_a: str) -> None:
    with connect(cluster.url, token=token_a + "0") as wrong, pytest.raises(PermissionDenied):
        wrong.stat("/teams/a")
    secret = token_a.split("_")[2]
    for path in cluster.root.rglob("*"):
        if path.is_file() and path.suffix in (".log", ".txt", "") and path.stat().st_size < 1 << 26:
            assert secret not in path.read_text(errors="replace"), path


def test_quotas_hold_under_16_writers_and_rm_gives_back(
    cluster: LocalCluster, operator: Client
) -> None:
    limit = 24 * MiB
    operator.add_tenant("q", "/teams/q", max_bytes=limit, max_files=1000)
    token = operator.issue_token("q", ttl_s=600)
    written: list[int] = []
    refused: list[QuotaExceeded] = []

    def writer(i: int, client: Client) -> None:
        n = 0
        while True:
            try:
                client.put(f"/teams/q/w{i}/{n}", os.urandom(MiB))
            except QuotaExceeded as exc:
                refused.append(exc)
                return
            written.append(MiB)
            n += 1

    with connect(cluster.url, token=token, chunk_size=MiB) as client:
        threads = [threading.Thread(target=writer, args=(i, client)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        (quota,) = [q for q in client.quotas() if q.path == "/teams/q"]
        files, size = client.du("/teams/q")
        assert len(refused) == 16 and all(e.errno == errno.EDQUOT for e in refused)
        assert size == quota.bytes == sum(written) <= limit + MiB  # never past it by a chunk
        assert files == quota.files and quota.physical == 2 * quota.bytes
        assert "tenant q's quota at /teams/q" in str(refused[0])

        # A big file is refused before its bytes go.
        with pytest.raises(QuotaExceeded), client.open("/teams/q/big", "wb") as big:
            big.write(os.urandom(8 * MiB))
        client.rm("/teams/q/w0", recursive=True)
        after = client.quotas("/teams/q")[0]
        assert after.bytes < quota.bytes and after.files < quota.files
        client.put("/teams/q/after-rm", os.urandom(MiB))


def _served(client: Client) -> bool:
    try:
        client.stat("/teams/a")
    except PermissionDenied:
        return False
    return True
