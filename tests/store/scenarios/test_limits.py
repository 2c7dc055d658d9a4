"""No size where the store stops working: files of many chunks, directories of
many entries, requests and replies larger than a frame header (issue 22, items
1 and 2), on real clusters, through every door.

Page sizes are lowered here (``_pages.LIST_PAGE``/``LAYOUT_PAGE``) so that a
few thousand entries cross many pages; chunks of 4 KiB make a 20 MiB file
as many chunks as 40 GiB in 8 MiB chunks. One slow test writes a real 10 GiB
file.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from cluster_kit import LocalCluster
from fuse_kit import mounted, needs_fuse

from graben.store import AsyncClient, IntegrityError, connect
from graben.store._types import FileCommit, FileLayout
from graben.store.client import _pages
from graben.store.transport._requests import Commit, GetLayout, Request

SMALL = 4096
"""Smallest chunk size: the most chunks per byte."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A 3-node cluster keeping 3 copies of each chunk."""
    kit = LocalCluster(tmp_path_factory.mktemp("limits"), 3)
    try:
        yield kit
    finally:
        kit.close()


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pages, "LIST_PAGE", 97)
    monkeypatch.setattr(_pages, "LAYOUT_PAGE", 61)


def _data(n: int) -> bytes:
    return hashlib.shake_256(b"graben").digest(n)


# -- files of many chunks ------------------------------------------------------


@pytest.mark.parametrize("pages", ["default", "small"])
def test_a_file_of_thousands_of_chunks_at_three_copies_reads_back(
    cluster: LocalCluster, pages: str, request: pytest.FixtureRequest
) -> None:
    # 5,000 chunks: a layout of ~2 MB and a commit of ~1.5 MB, over every frame
    # limit the wire had (a 256 KiB inbox, 1 MiB headers).
    if pages == "small":
        request.getfixturevalue("small_pages")
    data = _data(5000 * SMALL)
    with connect(cluster.url, chunk_size=SMALL) as c:
        info = c.put(f"/many-{pages}", data)
        assert info.size == len(data)
        assert c.get(f"/many-{pages}") == data
        with c.open(f"/many-{pages}") as f:
            f.seek(3 * SMALL + 5)
            assert f.read(10 * SMALL) == data[3 * SMALL + 5 : 13 * SMALL + 5]
        c.copy(f"/many-{pages}", f"/copy-{pages}")
        assert c.get_range(f"/copy-{pages}", len(data) - 100) == data[-100:]


def test_a_layout_gathered_while_the_file_is_replaced_is_one_whole_version(
    cluster: LocalCluster, small_pages: None
) -> None:
    old, new = _data(300 * SMALL), _data(400 * SMALL)[::-1]

    async def scenario() -> bytes:
        async with AsyncClient(cluster.url, chunk_size=SMALL) as c:
            await c.put("/swapped", old)
            real = c.meta.request
            swapped = False

            async def request(req: Request[Any]) -> Any:
                nonlocal swapped
                result = await real(req)
                if isinstance(req, GetLayout) and not swapped:  # between two pages
                    swapped = True
                    await c.put("/swapped", new)
                return result

            c.meta.request = request  # type: ignore[method-assign]
            return await c.get("/swapped")

    assert asyncio.run(scenario()) == new


def test_a_damaged_layout_is_a_loud_error_not_a_short_read(cluster: LocalCluster) -> None:
    with connect(cluster.url, chunk_size=SMALL) as c:
        c.put("/whole", _data(10 * SMALL))
        real = c.aio.meta.request

        async def request(req: Request[Any]) -> Any:
            result = await real(req)
            if isinstance(result, FileLayout):  # as if the engine had lost a row
                extents = result.extents[:3] + result.extents[4:]
                return FileLayout(result.info, extents, result.replicas, result.grants)
            return result

        c.aio.meta.request = request  # type: ignore[method-assign]
        with pytest.raises(IntegrityError, match="damaged"):
            c.get("/whole")
        c.aio.meta.request = real  # type: ignore[method-assign]


@needs_fuse
def test_a_file_of_thousands_of_chunks_reads_through_the_mount(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    data = _data(4000 * SMALL)
    with connect(cluster.url, chunk_size=SMALL) as c:
        c.put("/mounted/big", data)
    with mounted(cluster.url, tmp_path) as point:
        assert (point / "mounted" / "big").read_bytes() == data


def test_a_checkpoint_of_thousands_of_chunks_loads(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # In a process of its own: the checkpoint door keeps one client per store.
    script = tmp_path / "ckpt.py"
    script.write_text(
        "import sys, torch, torch.distributed.checkpoint as dcp\n"
        "from graben.checkpoint import GrabenReader, GrabenWriter\n"
        "url = sys.argv[1]\n"
        "state = {'w': torch.arange(4 << 20, dtype=torch.float32)}\n"
        "dcp.save(state, storage_writer=GrabenWriter(url), no_dist=True)\n"
        "out = {'w': torch.zeros(4 << 20)}\n"
        "dcp.load(out, storage_reader=GrabenReader(url), no_dist=True)\n"
        "assert torch.equal(out['w'], state['w'])\n"
        "print('ok')\n"
    )
    env = {**os.environ, "GRABEN_CHUNK_SIZE": str(SMALL)}  # 16 MiB: 4,096 chunks
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(script), f"{cluster.url}/ckpt/many"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


# -- directories of many entries -------------------------------------------------


def _fill(url: str, directory: str, count: int) -> None:
    """``count`` empty files in ``directory``, committed a few thousand at a time."""

    async def fill() -> None:
        async with AsyncClient(url) as c:
            for start in range(0, count, 5000):
                files = tuple(
                    FileCommit(f"{directory}/f{i:06d}", ())
                    for i in range(start, min(count, start + 5000))
                )
                await c.meta.request(Commit(files))

    asyncio.run(fill())


def _names(count: int) -> list[str]:
    return [f"f{i:06d}" for i in range(count)]


@pytest.mark.parametrize("pages", ["default", "small"])
def test_a_directory_of_twelve_thousand_entries_lists(
    cluster: LocalCluster, pages: str, request: pytest.FixtureRequest
) -> None:
    if pages == "small":
        request.getfixturevalue("small_pages")
    _fill(cluster.url, f"/wide-{pages}", 12_000)
    with connect(cluster.url) as c:
        assert [e.name for e in c.ls(f"/wide-{pages}")] == _names(12_000)


def _lists_everywhere(url: str, directory: str, count: int, where: Path) -> None:
    """``count`` entries of ``directory`` list whole through fsspec, the CLI and the mount."""
    want = _names(count)
    fs, path = fsspec.core.url_to_fs(f"{url}{directory}")
    assert sorted(p.rpartition("/")[2] for p in fs.ls(path, detail=False)) == want
    cli = subprocess.run(
        [sys.executable, "-m", "graben.store.cli", "ls", f"{url}{directory}"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    assert [line.rpartition("/")[2] for line in cli.stdout.split()] == want
    if os.path.exists("/dev/fuse"):
        with mounted(url, where) as point:
            assert sorted(os.listdir(point / directory.lstrip("/"))) == want


def test_twelve_thousand_entries_list_through_fsspec_the_cli_and_the_mount(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    _fill(cluster.url, "/wide-doors", 12_000)
    _lists_everywhere(cluster.url, "/wide-doors", 12_000, tmp_path)


def test_a_directory_listed_while_renamed_is_listed_whole(
    cluster: LocalCluster, small_pages: None
) -> None:
    _fill(cluster.url, "/moving", 1000)

    async def scenario() -> list[str]:
        async with AsyncClient(cluster.url) as c:
            real = c.meta.request
            moved = False

            async def request(req: Request[Any]) -> Any:
                nonlocal moved
                result = await real(req)
                if not moved:
                    moved = True
                    await c.rename("/moving", "/moved")
                return result

            c.meta.request = request  # type: ignore[method-assign]
            return [e.name for e in await c.ls("/moving")]

    assert asyncio.run(scenario()) == _names(1000)


@pytest.mark.huge
def test_a_directory_of_a_hundred_thousand_entries_lists_everywhere(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    _fill(cluster.url, "/huge", 100_000)
    with connect(cluster.url) as c:
        assert [e.name for e in c.ls("/huge")] == _names(100_000)
    _lists_everywhere(cluster.url, "/huge", 100_000, tmp_path)


@pytest.mark.huge
def test_a_ten_gib_file_at_three_copies(cluster: LocalCluster) -> None:
    """The size the issue found unreadable, for real (about a minute here)."""
    piece = _data(64 << 20)
    total = 10 << 30
    digest = hashlib.blake2b()
    with connect(cluster.url) as c:
        with c.open("/ten-gib", "wb") as f:
            for _ in range(total // len(piece)):
                f.write(piece)
        assert c.stat("/ten-gib").size == total
        with c.open("/ten-gib") as f:
            while block := f.read(64 << 20):
                digest.update(block)
        c.rm("/ten-gib")
    want = hashlib.blake2b()
    for _ in range(total // len(piece)):
        want.update(piece)
    assert digest.digest() == want.digest()


def test_servers_with_their_pages_lowered_still_answer_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test option: servers started with $GRABEN_PAGE_ENTRIES serve pages
    # that small, whatever a client asks for.
    monkeypatch.setenv("GRABEN_PAGE_ENTRIES", "13")
    kit = LocalCluster(tmp_path / "paged", 3)
    try:
        monkeypatch.delenv("GRABEN_PAGE_ENTRIES")
        _fill(kit.url, "/d", 1000)
        data = _data(700 * SMALL)
        with connect(kit.url, chunk_size=SMALL) as c:
            assert [e.name for e in c.ls("/d")] == _names(1000)
            c.put("/f", data)
            assert c.get("/f") == data
            assert c.fsck().ok
    finally:
        kit.close()
