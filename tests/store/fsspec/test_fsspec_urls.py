"""A ``graben://host:port/...`` URL names its store, whichever filesystem it is handed to.

Three real stores: the session's cluster (A), a second cluster this module
starts (B), and the embedded default store (``graben:///``, at
``$GRABEN_HOME``). Each test puts decoys at the same paths in the stores a
call must not reach, so a call that went to the wrong store reads the decoy
or overwrites it, and the test says so.

Over 500 lines: every kind of call (writes, deletes, reads, the names that
come back, Hugging Face ``datasets``, two stores in one call) shares the three
stores and their decoys; split, each file would start a second cluster.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pandas as pd
import pytest
from ranks_kit import free_port

from graben.store import Client, GrabenFileSystem, InvalidArgument, NotFound, connect
from graben.store.local import cluster_up

DECOY = b"decoy: the wrong store"
TRUTH = b"truth: the store the URL names " * 3


@pytest.fixture(scope="module")
def cluster_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second real cluster on loopback, beside the session's."""
    secret = Path(os.environ["GRABEN_SECRET_FILE"])
    with cluster_up(tmp_path_factory.mktemp("cluster-b"), nodes=1, secret_file=secret) as url:
        yield url


@dataclass(frozen=True)
class Stores:
    """The three stores, one fresh directory in each."""

    prefixes: dict[str, str]
    """Store name -> what a URL starts with (``graben://host:port``, ``graben://``)."""
    clients: dict[str, Client]
    """Store name -> a client of its own, to check what landed where."""
    root: str
    """This test's directory, the same path in every store."""

    def url(self, store: str, path: str = "") -> str:
        """The URL of ``root + path`` in ``store``."""
        return f"{self.prefixes[store]}{self.root}{path}"

    def fs(self, store: str) -> GrabenFileSystem:
        """A filesystem made for ``store``, as fsspec users make one: from a URL."""
        fs, _ = fsspec.core.url_to_fs(self.url(store))
        assert isinstance(fs, GrabenFileSystem)
        return fs

    def read(self, store: str, path: str) -> bytes | None:
        """What ``store`` holds at ``root + path`` (``None``: nothing)."""
        try:
            return self.clients[store].get(self.root + path)
        except NotFound:
            return None

    def seed(self, store: str, path: str, data: bytes) -> None:
        self.clients[store].put(self.root + path, data)


@pytest.fixture
def stores(
    cluster_url: str, cluster_b: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Stores]:
    home = tmp_path / "home"
    monkeypatch.setenv("GRABEN_HOME", str(home))
    monkeypatch.delenv("GRABEN_URL", raising=False)
    GrabenFileSystem.clear_instance_cache()
    clients = {"A": connect(cluster_url), "B": connect(cluster_b), "home": connect(home)}
    root = f"/urls-{uuid.uuid4().hex[:8]}"
    prefixes = {"A": cluster_url, "B": cluster_b, "home": "graben://"}
    try:
        yield Stores(prefixes, clients, root)
    finally:
        _forget_filesystems()
        for client in clients.values():
            if client.exists(root):
                client.rm(root, recursive=True)
            client.close()


def _forget_filesystems() -> None:
    """Close and drop every cached filesystem, as a fresh process would start with none."""
    for fs in list(GrabenFileSystem._cache.values()):
        fs.client.close()
    GrabenFileSystem.clear_instance_cache()


# (made for, URL names): a cluster's filesystem given the other cluster's URL or
# the default store's, and the default store's filesystem given a cluster's URL.
PAIRS = [("A", "B"), ("A", "home"), ("home", "B")]
PAIR_IDS = [f"{made}-given-{named}" for made, named in PAIRS]


def _others(named: str) -> list[str]:
    return [s for s in ("A", "B", "home") if s != named]


# --- writes ---------------------------------------------------------------------------

Write = tuple[Callable[[GrabenFileSystem, str, Path], object], bytes]
"""Writes at the URL through the filesystem; what should be there then."""


def _put_file(fs: GrabenFileSystem, url: str, tmp: Path) -> None:
    (tmp / "local").write_bytes(TRUTH)
    fs.put_file(str(tmp / "local"), url)


def _put(fs: GrabenFileSystem, url: str, tmp: Path) -> None:
    (tmp / "local").write_bytes(TRUTH)
    fs.put(str(tmp / "local"), url)


def _open_wb(fs: GrabenFileSystem, url: str, tmp: Path) -> None:
    with fs.open(url, "wb") as f:
        f.write(TRUTH)


def _open_wt(fs: GrabenFileSystem, url: str, tmp: Path) -> None:
    with fs.open(url, "wt") as f:
        f.write(TRUTH.decode())


def _mapper(fs: GrabenFileSystem, url: str, tmp: Path) -> None:
    parent, name = url.rsplit("/", 1)
    fs.get_mapper(parent)[name] = TRUTH


WRITES: dict[str, Write] = {
    "pipe_file": (lambda fs, url, tmp: fs.pipe_file(url, TRUTH), TRUTH),
    "pipe": (lambda fs, url, tmp: fs.pipe(url, TRUTH), TRUTH),
    "pipe-dict": (lambda fs, url, tmp: fs.pipe({url: TRUTH}), TRUTH),
    "write_bytes": (lambda fs, url, tmp: fs.write_bytes(url, TRUTH), TRUTH),
    "write_text": (lambda fs, url, tmp: fs.write_text(url, TRUTH.decode()), TRUTH),
    "open-wb": (_open_wb, TRUTH),
    "open-wt": (_open_wt, TRUTH),
    "touch": (lambda fs, url, tmp: fs.touch(url), b""),
    "put_file": (_put_file, TRUTH),
    "put": (_put, TRUTH),
    "cp_file": (lambda fs, url, tmp: fs.cp_file(url + ".src", url), b"source"),
    "copy": (lambda fs, url, tmp: fs.copy(url + ".src", url), b"source"),
    "mv": (lambda fs, url, tmp: fs.mv(url + ".src", url), b"source"),
    "rename": (lambda fs, url, tmp: fs.rename(url + ".src", url), b"source"),
    "get_mapper": (_mapper, TRUTH),
}


@pytest.mark.parametrize(("made", "named"), PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_a_write_to_a_url_lands_in_the_store_it_names(
    stores: Stores, made: str, named: str, write: Write, tmp_path: Path
) -> None:
    stores.seed(named, "/f.src", b"source")
    for other in _others(named):
        stores.seed(other, "/f", DECOY)
        stores.seed(other, "/f.src", DECOY)
    action, expected = write
    action(stores.fs(made), stores.url(named, "/f"), tmp_path)
    assert stores.read(named, "/f") == expected
    for other in _others(named):
        assert stores.read(other, "/f") == DECOY, f"{other} was written to"
        assert stores.read(other, "/f.src") == DECOY, f"{other} lost its file"


Mkdir = Callable[[GrabenFileSystem, str], object]

MKDIRS: dict[str, Mkdir] = {
    "mkdir": lambda fs, url: fs.mkdir(url),
    "makedirs": lambda fs, url: fs.makedirs(url),
    "makedir": lambda fs, url: fs.makedir(url),
    "mkdirs": lambda fs, url: fs.mkdirs(url, exist_ok=True),
}


@pytest.mark.parametrize(("made", "named"), PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("mkdir", MKDIRS.values(), ids=MKDIRS.keys())
def test_a_directory_made_at_a_url_is_made_in_the_store_it_names(
    stores: Stores, made: str, named: str, mkdir: Mkdir
) -> None:
    stores.seed(named, "/keep", b"k")  # the root directory exists
    mkdir(stores.fs(made), stores.url(named, "/d/e"))
    assert stores.clients[named].stat(stores.root + "/d/e").is_dir
    for other in _others(named):
        assert not stores.clients[other].exists(stores.root + "/d")


# --- deletes --------------------------------------------------------------------------

Delete = Callable[[GrabenFileSystem, str], object]

DELETES: dict[str, Delete] = {
    "rm": lambda fs, url: fs.rm(url),
    "rm-recursive": lambda fs, url: fs.rm(url.rsplit("/", 1)[0], recursive=True),
    "rm-glob": lambda fs, url: fs.rm(url.rsplit("/", 1)[0] + "/*"),
    "rm-list": lambda fs, url: fs.rm([url]),
    "rm_file": lambda fs, url: fs.rm_file(url),
    "delete": lambda fs, url: fs.delete(url),
    "_rm": lambda fs, url: fs._rm(url),
}


@pytest.mark.parametrize(("made", "named"), PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("delete", DELETES.values(), ids=DELETES.keys())
def test_a_delete_at_a_url_deletes_only_in_the_store_it_names(
    stores: Stores, made: str, named: str, delete: Delete
) -> None:
    stores.seed(named, "/d/f", TRUTH)
    for other in _others(named):
        stores.seed(other, "/d/f", DECOY)
    delete(stores.fs(made), stores.url(named, "/d/f"))
    assert stores.read(named, "/d/f") is None
    for other in _others(named):
        assert stores.read(other, "/d/f") == DECOY, f"{other} lost its file"


def test_rmdir_at_a_url_removes_the_directory_in_the_store_it_names(stores: Stores) -> None:
    stores.clients["B"].mkdir(stores.root + "/empty", parents=True)
    stores.clients["A"].mkdir(stores.root + "/empty", parents=True)
    stores.fs("A").rmdir(stores.url("B", "/empty"))
    assert not stores.clients["B"].exists(stores.root + "/empty")
    assert stores.clients["A"].exists(stores.root + "/empty")


# --- reads ----------------------------------------------------------------------------

Read = Callable[[GrabenFileSystem, str, Path], object]
"""Reads the file at the URL (``.src`` and ``only/`` beside it exist only in the named store)."""


def _get_file(fs: GrabenFileSystem, url: str, tmp: Path) -> bytes:
    fs.get_file(url, str(tmp / "got"))
    return (tmp / "got").read_bytes()


def _get(fs: GrabenFileSystem, url: str, tmp: Path) -> bytes:
    fs.get(url, str(tmp / "got"))
    return (tmp / "got").read_bytes()


def _open_rb(fs: GrabenFileSystem, url: str, tmp: Path) -> bytes:
    with fs.open(url, "rb") as f:
        data: bytes = f.read()
    return data


READS: dict[str, Read] = {
    "cat_file": lambda fs, url, tmp: fs.cat_file(url),
    "cat_file-range": lambda fs, url, tmp: fs.cat_file(url, 6, 12),
    "cat": lambda fs, url, tmp: fs.cat(url),
    "cat_ranges": lambda fs, url, tmp: fs.cat_ranges([url], [0], [9]),
    "head": lambda fs, url, tmp: fs.head(url, 9),
    "tail": lambda fs, url, tmp: fs.tail(url, 9),
    "read_bytes": lambda fs, url, tmp: fs.read_bytes(url),
    "read_text": lambda fs, url, tmp: fs.read_text(url),
    "open-rb": _open_rb,
    "get_file": _get_file,
    "get": _get,
    "get_mapper": lambda fs, url, tmp: fs.get_mapper(url.rsplit("/", 1)[0])["f"],
    "size": lambda fs, url, tmp: fs.size(url),
    "sizes": lambda fs, url, tmp: fs.sizes([url]),
    "info-size": lambda fs, url, tmp: fs.info(url)["size"],
    "stat-size": lambda fs, url, tmp: fs.stat(url)["size"],
    "checksum": lambda fs, url, tmp: fs.checksum(url),
    "ukey": lambda fs, url, tmp: fs.ukey(url),
    "exists": lambda fs, url, tmp: fs.exists(url + ".src"),
    "lexists": lambda fs, url, tmp: fs.lexists(url + ".src"),
    "isfile": lambda fs, url, tmp: fs.isfile(url + ".src"),
    "isdir": lambda fs, url, tmp: fs.isdir(url.rsplit("/", 1)[0] + "/only"),
    "du": lambda fs, url, tmp: fs.du(url),
    "disk_usage": lambda fs, url, tmp: fs.disk_usage(url),
}


@pytest.mark.parametrize(("made", "named"), PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
def test_a_read_at_a_url_reads_the_store_it_names(
    stores: Stores, made: str, named: str, read: Read, tmp_path: Path
) -> None:
    stores.seed(named, "/f", TRUTH)
    stores.seed(named, "/f.src", b"source")
    stores.seed(named, "/only/x", b"x")
    for other in _others(named):
        stores.seed(other, "/f", DECOY)
    # the reference: the same call on the named store's own filesystem
    (tmp_path / "plain").mkdir()
    (tmp_path / "url").mkdir()
    expected = read(stores.fs(named), stores.url(named, "/f"), tmp_path / "plain")
    got = read(stores.fs(made), stores.url(named, "/f"), tmp_path / "url")
    if isinstance(got, dict):  # cat of one URL answers {name: data}: names aside, the data
        got, expected = list(got.values()), list(expected.values())  # type: ignore[attr-defined]
    assert got == expected


# --- names that come back --------------------------------------------------------------


def _shards(stores: Stores, store: str, mark: str) -> None:
    for i in range(3):
        frame = pd.DataFrame({"shard": [i] * 4, "store": [mark] * 4})
        stores.clients[store].put(f"{stores.root}/pq/part-{i}.parquet", frame.to_parquet())
    stores.clients[store].put(f"{stores.root}/pq/README", mark.encode())


@pytest.mark.parametrize(("made", "named"), PAIRS, ids=PAIR_IDS)
def test_glob_results_reopen_on_the_store_the_pattern_named(
    stores: Stores, made: str, named: str
) -> None:
    _shards(stores, named, "truth")
    for other in _others(named):
        _shards(stores, other, "decoy")
    pattern = stores.url(named, "/pq/*.parquet")
    found = stores.fs(made).glob(pattern)
    assert found == [stores.url(named, f"/pq/part-{i}.parquet") for i in range(3)]
    _forget_filesystems()
    for name in found:
        with fsspec.open(name, "rb") as f:  # fsspec.open on the name as it came back
            assert pd.read_parquet(f)["store"].unique().tolist() == ["truth"]
        assert pd.read_parquet(name)["store"].unique().tolist() == ["truth"]


@pytest.mark.parametrize(
    ("named", "streaming"),
    [("B", False), ("B", True), ("home", False)],
    ids=["cluster", "cluster-streaming", "default-store"],
)
def test_hugging_face_datasets_reads_the_store_the_url_names(
    stores: Stores, named: str, streaming: bool, tmp_path: Path
) -> None:
    """The real ``datasets.load_dataset``: it globs the pattern, makes a URL of each
    name by putting ``graben://`` in front, then opens each on its own.

    Not the default store streaming: ``datasets`` passes each URL through
    ``pathlib``, which folds ``graben:///pq`` into ``graben://pq``; the test below
    checks that this is refused clearly, never read from elsewhere."""
    datasets = pytest.importorskip("datasets")
    _shards(stores, named, "truth")
    for other in _others(named):
        _shards(stores, other, "decoy")
    loaded = datasets.load_dataset(
        "parquet",
        data_files=stores.url(named, "/pq/*.parquet"),
        split="train",
        streaming=streaming,
        cache_dir=str(tmp_path / "hf"),
    )
    rows = list(loaded)
    assert len(rows) == 12
    assert {row["store"] for row in rows} == {"truth"}
    assert sorted(row["shard"] for row in rows) == [i for i in range(3) for _ in range(4)]


def test_hugging_face_streaming_of_the_default_store_fails_clearly(
    stores: Stores, tmp_path: Path
) -> None:
    datasets = pytest.importorskip("datasets")
    _shards(stores, "home", "truth")
    loaded = functools.partial(
        datasets.load_dataset,
        "parquet",
        data_files=stores.url("home", "/pq/*.parquet"),
        split="train",
        streaming=True,
        cache_dir=str(tmp_path / "hf"),
    )
    with pytest.raises(InvalidArgument, match="three slashes"):
        list(loaded())


def test_fsspec_helpers_hand_back_urls_of_the_store_named(stores: Stores) -> None:
    """Every name fsspec's helpers give back opens again, by ``fsspec.open``, on that store."""
    _shards(stores, "B", "truth")
    _shards(stores, "home", "decoy")
    pattern = stores.url("B", "/pq/*.parquet")
    files = fsspec.open_files(pattern, "rb")
    wanted = [stores.url("B", f"/pq/part-{i}.parquet") for i in range(3)]
    assert [f.full_name for f in files] == wanted
    fs, _, paths = fsspec.core.get_fs_token_paths(pattern)
    assert [f"{fs.protocol}://{p}" for p in paths] == wanted
    assert [fs.unstrip_protocol(p) for p in paths] == wanted
    fs, stripped = fsspec.core.url_to_fs(stores.url("B", "/pq"))
    assert [f"graben://{name}" for name in fs.ls(stripped, detail=False)][1:] == wanted
    _forget_filesystems()
    for url in wanted:
        with fsspec.open(url, "rb") as f:
            assert pd.read_parquet(f)["store"].unique().tolist() == ["truth"]


@pytest.mark.parametrize(("made", "named"), PAIRS, ids=PAIR_IDS)
def test_listings_of_a_url_name_entries_by_url(stores: Stores, made: str, named: str) -> None:
    _shards(stores, named, "truth")
    for other in _others(named):
        stores.seed(other, "/pq/decoy", DECOY)
    fs, d = stores.fs(made), stores.url(named, "/pq")
    names = [f"{d}/README", *(f"{d}/part-{i}.parquet" for i in range(3))]
    assert fs.ls(d, detail=False) == names
    assert [e["name"] for e in fs.ls(d)] == names
    assert fs.listdir(d, detail=False) == names
    assert fs.find(d) == names
    assert list(fs.find(d, detail=True)) == names
    assert [e["name"] for e in fs.find(d, detail=True).values()] == names
    assert fs.expand_path(f"{d}/*") == names
    assert fs.info(names[0])["name"] == names[0]
    assert sorted(fs.du(d, total=False)) == names
    ((top, dirs, files),) = list(fs.walk(d))
    assert (top, dirs, sorted(files)) == (d, [], sorted(n.rsplit("/", 1)[1] for n in names))
    assert list(fs.cat(f"{d}/README*")) == [f"{d}/README"]
    for name in names:
        assert fs.unstrip_protocol(name) == name
        with fsspec.open(name, "rb") as f:
            assert f.read(4) in (b"PAR1", b"trut")


def test_plain_names_unstrip_to_their_own_store(stores: Stores) -> None:
    _shards(stores, "B", "truth")
    _shards(stores, "home", "decoy")
    fs = stores.fs("B")
    found = fs.glob(f"{stores.root}/pq/*.parquet")  # a plain pattern: plain names
    assert found == [f"{stores.root}/pq/part-{i}.parquet" for i in range(3)]
    urls = [fs.unstrip_protocol(name) for name in found]
    assert urls == [stores.url("B", name[len(stores.root) :]) for name in found]
    _forget_filesystems()
    for url in urls:
        assert pd.read_parquet(url)["store"].unique().tolist() == ["truth"]


def test_url_to_fs_round_trips(stores: Stores) -> None:
    b, a = stores.prefixes["B"], stores.prefixes["A"]
    fs, path = fsspec.core.url_to_fs(f"{b}/x/y.bin")
    assert isinstance(fs, GrabenFileSystem)
    assert path == f"{b.removeprefix('graben://')}/x/y.bin"  # the store stays, like a bucket
    assert f"{fs.protocol}://{path}" == f"{b}/x/y.bin"
    assert fs.url == b
    assert fs.unstrip_protocol(path) == f"{b}/x/y.bin"
    again, again_path = fsspec.core.url_to_fs(fs.unstrip_protocol(path))
    assert (again, again_path) == (fs, path)
    assert fsspec.core.url_to_fs(f"{a}/x/y.bin")[0] is not fs  # one instance per store
    assert GrabenFileSystem._parent(f"{b}/x/y.bin") == f"{b}/x"
    assert GrabenFileSystem._parent(f"{b}/x") == f"{b}/"
    assert GrabenFileSystem._parent("graben:///x/y") == "graben:///x"
    assert GrabenFileSystem._parent("/x/y") == "/x"
    home, home_path = fsspec.core.url_to_fs("graben:///x/y.bin")
    assert home.unstrip_protocol(home_path) == "graben:///x/y.bin"


def test_an_embedded_store_that_is_not_the_default_has_no_url(tmp_path: Path) -> None:
    """``graben:///x`` would name the default store, not this one: no URL, not a wrong one."""
    fs = GrabenFileSystem(url=str(tmp_path / "elsewhere"), skip_instance_cache=True)
    try:
        with pytest.raises(InvalidArgument, match="no graben:// URL"):
            fs.unstrip_protocol("/x")
    finally:
        fs.client.close()


# --- one call, two stores ------------------------------------------------------------

Cross = Callable[[GrabenFileSystem, str, str], object]

CROSS: dict[str, Cross] = {
    "cp_file": lambda fs, src, dst: fs.cp_file(src, dst),
    "copy": lambda fs, src, dst: fs.copy(src, dst),
    "copy-lists": lambda fs, src, dst: fs.copy([src], [dst]),
    "mv": lambda fs, src, dst: fs.mv(src, dst),
    "rename": lambda fs, src, dst: fs.rename(src, dst),
}


@pytest.mark.parametrize(
    ("source", "dest"), [("A", "B"), ("B", "A"), ("B", "home"), ("plain", "B")]
)
@pytest.mark.parametrize("cross", CROSS.values(), ids=CROSS.keys())
def test_a_copy_or_move_between_two_stores_fails_and_changes_nothing(
    stores: Stores, source: str, dest: str, cross: Cross
) -> None:
    fs = stores.fs("A")
    src_store = "A" if source == "plain" else source  # a plain path is the filesystem's own
    stores.seed(src_store, "/f", TRUTH)
    src = stores.root + "/f" if source == "plain" else stores.url(source, "/f")
    with pytest.raises(InvalidArgument, match="two stores") as caught:
        cross(fs, src, stores.url(dest, "/g"))
    assert stores.prefixes[dest] in str(caught.value)
    assert stores.read(src_store, "/f") == TRUTH
    for store in ("A", "B", "home"):
        assert stores.read(store, "/g") is None


def test_a_copy_to_a_store_that_is_down_is_refused_as_two_stores(stores: Stores) -> None:
    nowhere = f"graben://127.0.0.1:{free_port()}"  # nothing listens there
    stores.seed("A", "/f", TRUTH)
    with pytest.raises(InvalidArgument, match="two stores"):
        stores.fs("A").cp_file(stores.url("A", "/f"), f"{nowhere}{stores.root}/g")
    assert stores.read("A", "/g") is None


def test_a_transaction_refuses_another_stores_url(stores: Stores) -> None:
    fs = stores.fs("A")
    with pytest.raises(InvalidArgument, match="transaction"), fs.transaction:
        with fs.open(stores.url("A", "/mine"), "wb") as f:
            f.write(b"mine")
        with fs.open(stores.url("B", "/theirs"), "wb") as f:
            f.write(b"theirs")
    for store in ("A", "B", "home"):
        assert stores.read(store, "/mine") is None
        assert stores.read(store, "/theirs") is None


def test_a_url_without_a_port_is_refused_clearly(stores: Stores) -> None:
    fs = stores.fs("A")
    with pytest.raises(InvalidArgument, match="host:port"):
        fs.pipe_file(f"graben://127.0.0.1{stores.root}/x", b"x")
    with pytest.raises(InvalidArgument, match="not a store URL"):
        fs.pipe_file(f"graben://127.0.0.1:http{stores.root}/x", b"x")
    for store in ("A", "B", "home"):
        assert stores.read(store, "/x") is None
