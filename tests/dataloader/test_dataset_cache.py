"""The node cache is private to its user: no other user's directory, no link followed."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from graben.dataloader import CachedDataset, Manifest, Shard, write_dataset
from graben.store import IntegrityError, NoSpace, NotADirectory, PermissionDenied

NOBODY = 65534
"""Another local user: the one planting links."""
SAMPLES = [b"first", b"second", b"third"]
PRECIOUS = b"root's own file, mode 0600\n"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making another user's directory needs root")


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[str, Manifest]:
    url = str(tmp_path / "ds")
    return url, write_dataset(url, SAMPLES, rows_per_shard=2)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of ours that no cache should ever write to."""
    path = tmp_path / "victim"
    path.write_bytes(PRECIOUS)
    path.chmod(0o600)
    return path


def _untouched(victim: Path) -> None:
    st = victim.lstat()
    assert victim.read_bytes() == PRECIOUS
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, os.geteuid())


def _key(url: str, shard: Shard) -> str:
    """The cache's name for a shard: predictable from the dataset's URL and manifest."""
    ident = f"{url}\0{shard.name}\0{shard.crc32c}".encode()
    return f"{hashlib.blake2b(ident, digest_size=8).hexdigest()}-{shard.name}"


def _plant(cache: Path, url: str, manifest: Manifest, victim: Path, mode: int) -> None:
    """Another user's cache directory, with a link to ``victim`` at every name a fill opens."""
    (cache / ".locks").mkdir(parents=True)
    for shard in manifest.shards:
        key = _key(url, shard)
        for name in (key, f".fill-{os.getpid()}-{key}", f".locks/{key}"):
            (cache / name).symlink_to(victim)
    for path in (cache, cache / ".locks"):
        os.chown(path, NOBODY, NOBODY)
        path.chmod(mode)


def _private(path: Path, mode: int = 0o700) -> None:
    st = path.lstat()
    assert stat.S_ISDIR(st.st_mode) if mode == 0o700 else stat.S_ISREG(st.st_mode)
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (mode, os.geteuid())


@as_root
@pytest.mark.parametrize("mode", [0o777, 0o755])
def test_another_users_cache_directory_is_refused(
    dataset: tuple[str, Manifest], victim: Path, tmp_path: Path, mode: int
) -> None:
    url, manifest = dataset
    cache = tmp_path / "shared"
    _plant(cache, url, manifest, victim, mode)
    with pytest.raises(PermissionDenied) as refused:
        list(CachedDataset(url, cache_dir=cache))
    assert f"uid {NOBODY}" in str(refused.value) and str(cache) in str(refused.value)
    _untouched(victim)


@as_root
def test_a_default_cache_directory_planted_by_another_user_is_refused(
    dataset: tuple[str, Manifest], victim: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, manifest = dataset
    shared = tmp_path / "xdg"  # as if $XDG_CACHE_HOME were a directory others can write to
    shared.mkdir(mode=0o1777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    _plant(shared / "graben" / "datasets", url, manifest, victim, 0o777)
    os.chown(shared / "graben", NOBODY, NOBODY)
    (shared / "graben").chmod(0o777)
    with pytest.raises(PermissionDenied, match=f"uid {NOBODY}"):
        list(CachedDataset(url))
    _untouched(victim)


@pytest.mark.parametrize("where", ["xdg", "home"])
def test_the_default_cache_is_private_to_its_user(
    dataset: tuple[str, Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    url, manifest = dataset
    if where == "xdg":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        mine = tmp_path / "xdg" / "graben"
    else:  # no $XDG_CACHE_HOME: ~/.cache, made if missing
        monkeypatch.delenv("XDG_CACHE_HOME")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        (tmp_path / "home").mkdir()
        mine = tmp_path / "home" / ".cache" / "graben"
    ds = CachedDataset(url, shuffle=False)
    assert list(ds) == SAMPLES
    assert ds.cache_dir == mine / "datasets"
    for directory in (mine, mine / "datasets", mine / "datasets" / ".locks"):
        _private(directory)
    files = [p for p in (mine / "datasets").rglob("*") if p.is_file()]
    assert len(files) == 2 * len(manifest.shards) + 1  # shards, their locks, the directory's
    for path in files:
        _private(path, 0o600)
    disk = os.statvfs(tmp_path)
    assert ds.cache_limit == min(100 << 30, disk.f_blocks * disk.f_frsize // 2)  # the default


def test_a_cache_limit_in_human_units(dataset: tuple[str, Manifest], tmp_path: Path) -> None:
    url, _ = dataset
    assert CachedDataset(url, cache_dir=tmp_path, cache_limit="1.5G").cache_limit == 3 << 29
    with pytest.raises(ValueError, match="not a size: '50 gigs'"):
        CachedDataset(url, cache_dir=tmp_path, cache_limit="50 gigs")


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda p: (p.mkdir(), p.chmod(0o777)), PermissionDenied, "writable by others"),
        (lambda p: (p.mkdir(), p.chmod(0o2770)), PermissionDenied, "writable by its group"),
        (lambda p: p.symlink_to(p.parent), PermissionDenied, "symbolic link"),
        (lambda p: p.write_bytes(b""), NotADirectory, "not a directory"),
    ],
)
def test_an_unsafe_cache_directory_is_refused(
    dataset: tuple[str, Manifest], tmp_path: Path, make: object, error: type, words: str
) -> None:
    cache = tmp_path / "cache"
    make(cache)  # type: ignore[operator]
    with pytest.raises(error) as refused:
        list(CachedDataset(dataset[0], cache_dir=cache))
    assert words in str(refused.value) and str(cache) in str(refused.value)


def test_links_inside_the_cache_are_not_followed(
    dataset: tuple[str, Manifest], victim: Path, tmp_path: Path
) -> None:
    url, manifest = dataset
    cache = tmp_path / "cache"
    assert list(CachedDataset(url, cache_dir=cache, shuffle=False)) == SAMPLES
    shard = manifest.shards[0]
    key = _key(url, shard)
    victim.write_bytes((Path(url) / shard.name).read_bytes())  # what the link would serve
    victim.chmod(0o600)
    for name in (key, f".locks/{key}"):
        (cache / name).unlink()
        (cache / name).symlink_to(victim)
    again = CachedDataset(url, cache_dir=cache, shuffle=False)
    assert list(again) == SAMPLES
    assert again.stats["cache_fills"] == 1  # the link was dropped and the shard fetched again
    for name in (key, f".locks/{key}"):
        _private(cache / name, 0o600)
    assert victim.read_bytes() == (Path(url) / shard.name).read_bytes()


def test_a_fill_that_lands_while_another_looks_is_used_not_fetched_again(tmp_path: Path) -> None:
    # Two readers of one node cache (threads or processes): one finds no copy,
    # the other's fill is renamed into place at that moment. The first must
    # take that copy, not delete it and fetch the shard a second time.
    import crc32c

    from graben.dataloader._cache import NodeCache

    data = os.urandom(105)
    shard = Shard("img/005.jpg", 1, len(data), crc32c.crc32c(data))
    fetched: list[tuple[int, int]] = []

    def fetch(start: int, end: int) -> bytes:
        fetched.append((start, end))
        return data[start:end]

    mine, theirs = NodeCache(tmp_path / "c"), NodeCache(tmp_path / "c")
    looked = mine._mapped_copy

    def look_then_their_fill_lands(key: str, size: int) -> memoryview | None:
        found = looked(key, size)
        if not fetched:
            theirs.open("ds", shard, fetch).release()
        return found

    mine._mapped_copy = look_then_their_fill_lands  # type: ignore[method-assign]
    assert bytes(mine.open("ds", shard, fetch)) == data
    assert len(fetched) == 1, "the shard was fetched twice"
    assert mine.stats.refetched == 0


def test_a_fill_waits_for_room_while_others_fills_take_the_whole_cache(tmp_path: Path) -> None:
    # Two fills in progress take the whole limit; a third fill must wait for one
    # of them to land (then it may be evicted), not fail with "cache full".
    import threading

    import crc32c

    from graben.dataloader._cache import NodeCache

    blobs = [os.urandom(1000) for _ in range(3)]
    shards = [Shard(f"s{i}", 1, 1000, crc32c.crc32c(b)) for i, b in enumerate(blobs)]
    go = threading.Event()

    def slow(i: int):  # type: ignore[no-untyped-def]
        def fetch(start: int, end: int) -> bytes:
            go.wait(30)
            return blobs[i][start:end]

        return fetch

    cache = NodeCache(tmp_path / "c", limit=2000)
    results: dict[int, bytes] = {}

    def fill(i: int) -> None:
        view = cache.open("ds", shards[i], slow(i))
        results[i] = bytes(view)
        view.release()

    stuck = [threading.Thread(target=fill, args=(i,)) for i in (0, 1)]
    for t in stuck:
        t.start()
    while cache.used() < 2000:  # both fills have their room
        threading.Event().wait(0.01)
    threading.Timer(0.3, go.set).start()
    third = cache.open("ds", shards[2], slow(2))
    assert bytes(third) == blobs[2]
    third.release()
    for t in stuck:
        t.join(30)
    assert results == {0: blobs[0], 1: blobs[1]}
    assert cache.used() <= 2000


def test_a_shard_too_big_or_damaged_is_told_in_the_stores_errors(tmp_path: Path) -> None:
    import crc32c

    from graben.dataloader._cache import NodeCache

    data = os.urandom(100)
    shard = Shard("s", 1, len(data), crc32c.crc32c(data))
    with pytest.raises(NoSpace, match="cannot fit") as full:
        NodeCache(tmp_path / "small", limit=99).open("ds", shard, lambda s, e: data[s:e])
    assert full.value.filename == str(tmp_path / "small")
    with pytest.raises(IntegrityError, match="does not match its manifest") as damaged:
        NodeCache(tmp_path / "c").open("ds", shard, lambda s, e: bytes(e - s))
    assert damaged.value.filename == "s"


@as_root
def test_a_link_of_another_user_on_the_way_to_the_cache_is_refused(
    dataset: tuple[str, Manifest], tmp_path: Path
) -> None:
    """Only the last part used to be opened without following links: a link further up,
    planted by someone else, pointed the cache into their directory."""
    url, _ = dataset
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    middle = tmp_path / "middle"
    middle.symlink_to(theirs)
    os.chown(middle, NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(PermissionDenied, match=f"link of uid {NOBODY}") as refused:
        list(CachedDataset(url, cache_dir=middle / "cache"))
    assert str(middle) in str(refused.value)
    assert not (theirs / "cache").exists() or not any((theirs / "cache").iterdir())


@as_root
def test_a_directory_of_another_user_on_the_way_is_refused(
    dataset: tuple[str, Manifest], tmp_path: Path
) -> None:
    url, _ = dataset
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    (theirs / "mine").mkdir()  # root's, but inside a directory they may rearrange
    with pytest.raises(PermissionDenied, match=f"directory of uid {NOBODY}"):
        list(CachedDataset(url, cache_dir=theirs / "mine" / "cache"))


def test_my_own_links_on_the_way_are_followed(
    dataset: tuple[str, Manifest], tmp_path: Path
) -> None:
    """A home or scratch path reached through a link of one's own works as before."""
    url, _ = dataset
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")
    (tmp_path / "rel").symlink_to("real")
    for link in ("via", "rel"):
        ds = CachedDataset(url, cache_dir=tmp_path / link / f"cache-{link}", shuffle=False)
        assert list(ds) == SAMPLES
        assert (tmp_path / "real" / f"cache-{link}").is_dir()
