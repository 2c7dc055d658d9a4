"""``remove_each`` and ``set_attributes_each``: several removals or attribute changes in
one transaction, each on its own (a mount's unlinks, chmods and touches go this way in
groups), on both kinds of store; a tenant's token is held to its prefix for every path
it names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from graben.store import (
    Change,
    Client,
    DirectoryNotEmpty,
    FileInfo,
    InvalidArgument,
    IsADirectory,
    NotFound,
    PermissionDenied,
    connect,
)
from graben.store.local import LocalCluster


def test_each_path_goes_or_gets_its_own_error(client: Client) -> None:
    for name in "abc":
        client.put(f"/d/{name}", name.encode())
    client.mkdir("/d/empty")
    client.put("/d/full/x", b"x")
    paths = ["/d/a", "/d/missing", "/d/full", "/d/b", "/d/empty", "/d/c", "/d/a"]
    errors = client.remove_each(paths, directories=False)
    kinds = [None if e is None else type(e) for e in errors]
    assert kinds == [None, NotFound, IsADirectory, None, IsADirectory, None, NotFound]
    assert errors[1] is not None and errors[1].path == "/d/missing"
    assert sorted(e.name for e in client.ls("/d")) == ["empty", "full"]
    assert client.exists("/d/full/x")
    # Directories allowed: the empty one goes, the full one stays.
    errors = client.remove_each(["/d/empty", "/d/full"])
    assert errors[0] is None and isinstance(errors[1], DirectoryNotEmpty)
    assert [e.name for e in client.ls("/d")] == ["full"]


def test_a_file_with_another_name_keeps_its_bytes(client: Client) -> None:
    client.put("/one", b"shared bytes")
    client.link("/one", "/two")
    assert client.remove_each(["/one"]) == [None]
    assert client.get("/two") == b"shared bytes"
    assert client.stat("/two").nlink == 1


def test_the_root_is_refused_and_nothing_else_is_held_back(client: Client) -> None:
    client.put("/f", b"f")
    errors = client.remove_each(["/", "/f"])
    assert errors[0] is not None and "root" in str(errors[0])
    assert errors[1] is None and not client.exists("/f")


def test_a_group_of_thousands_is_one_call(client: Client) -> None:
    for i in range(300):
        client.put(f"/many/{i:04d}", b"")
    assert client.remove_each([f"/many/{i:04d}" for i in range(300)]) == [None] * 300
    assert client.ls("/many") == []


def test_attributes_change_in_order_and_a_gone_path_is_its_own_error(client: Client) -> None:
    client.put("/a/f", b"f")
    client.mkdir("/a/d")
    before = client.stat("/a/f")
    done = client.set_attributes_each(
        [
            ("/a/f", Change(mode=0o600)),
            ("/a/gone", Change(mode=0o600)),
            ("/a/d", Change(mtime_ns=10**18, uid=7, gid=8)),
            ("/a/f", Change(mode=0o640, mtime_ns=2 * 10**18)),
        ]
    )
    assert isinstance(done[1], NotFound)
    f, d = done[3], done[2]
    assert isinstance(f, FileInfo) and isinstance(d, FileInfo)
    assert f.mode & 0o777 == 0o640 and f.mtime_ns == 2 * 10**18 and f.ctime_ns > before.ctime_ns
    assert client.stat("/a/f") == f
    assert (d.mtime_ns, d.uid, d.gid, d.is_dir) == (10**18, 7, 8, True)
    with pytest.raises(InvalidArgument):  # a bad change refuses the call: nothing changes
        client.set_attributes_each([("/a/f", Change(mode=0o700)), ("/a/d", Change(mode=1 << 20))])
    assert client.stat("/a/f").mode & 0o777 == 0o640


@pytest.fixture(scope="module")
def tenant_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("remove-each"), 1, replication=1)
    try:
        yield c
    finally:
        c.close()


def test_a_tenants_token_removes_only_below_its_prefix(
    tenant_cluster: LocalCluster, tmp_path: Path
) -> None:
    with connect(tenant_cluster.url) as operator:
        operator.add_tenant("a", "/teams/a")
        operator.put("/teams/a/mine", b"a")
        operator.put("/teams/b/theirs", b"b")
        token = operator.issue_token("a", rights="rw")
        with connect(tenant_cluster.url, token=token) as team_a:
            # One path outside the prefix refuses the whole call: nothing goes.
            with pytest.raises(PermissionDenied):
                team_a.remove_each(["/teams/a/mine", "/teams/b/theirs"])
            with pytest.raises(PermissionDenied):
                team_a.remove_each(["/teams/a"])  # the prefix itself is the operator's
            assert operator.exists("/teams/a/mine") and operator.exists("/teams/b/theirs")
            with pytest.raises(PermissionDenied):
                team_a.set_attributes_each([("/teams/b/theirs", Change(mode=0o600))])
            assert operator.stat("/teams/b/theirs").mode & 0o777 != 0o600
            [mine] = team_a.set_attributes_each([("/teams/a/mine", Change(mode=0o600))])
            assert isinstance(mine, FileInfo) and mine.mode & 0o777 == 0o600
            assert team_a.remove_each(["/teams/a/mine"]) == [None]
        assert not operator.exists("/teams/a/mine") and operator.exists("/teams/b/theirs")
