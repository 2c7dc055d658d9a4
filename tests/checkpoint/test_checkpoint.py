"""The checkpoint door: DCP saves and loads through GrabenWriter / GrabenReader.

Multi-rank tests run real gloo ranks as subprocesses (``ckpt_ranks.py``);
the rest use DCP's ``no_dist`` mode in this process.
"""

from __future__ import annotations

import io
import json
import pickle
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from cluster_kit import LocalCluster
from ranks_kit import assert_ok, run_ranks
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException

from graben.checkpoint import GrabenReader, GrabenWriter
from graben.store import IntegrityError, InvalidArgument, connect

RANKS = Path(__file__).with_name("ckpt_ranks.py")
# DCP warns that no_dist means one process: what these tests mean.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _state(seed: int = 0) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(128, 64, generator=gen),
        "half": torch.randn(16, 16, generator=gen).to(torch.bfloat16),
        "ids": torch.arange(1000, dtype=torch.int64),
        "mask": torch.rand(33, generator=gen) > 0.5,
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 8),
        "view": torch.randn(10, 10, generator=gen)[2:5],  # a view into a larger storage
        "meta": {"step": 12, "name": "run-a"},
    }


def _zeros_like(state: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            out[key] = torch.zeros_like(value.contiguous())
        elif isinstance(value, dict):
            out[key] = dict.fromkeys(value)
        else:
            out[key] = value
    return out


def _assert_same(got: dict[str, object], want: dict[str, object]) -> None:
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), key  # type: ignore[arg-type]
        else:
            assert got[key] == value, key


def _save(url: str, state: dict[str, object], **kwargs: object) -> None:
    dcp.save(state, storage_writer=GrabenWriter(url, **kwargs), no_dist=True)  # type: ignore[arg-type]


def _load(url: str, like: dict[str, object]) -> dict[str, object]:
    out = _zeros_like(like)
    dcp.load(out, storage_reader=GrabenReader(url), no_dist=True)
    return out


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default store (``graben:///``) is an embedded one here."""
    monkeypatch.setenv("GRABEN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRABEN_URL", raising=False)
    return tmp_path / "home"


def _chunk_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in (store / "chunks").rglob("*") if p.is_file())


def test_round_trip_every_kind_of_item(home: Path) -> None:
    state = _state()
    _save("graben:///ckpt/step-1", state)
    _assert_same(_load("graben:///ckpt/step-1", state), state)
    with connect(home) as client:
        names = {e.path.rsplit("/", 1)[1] for e in client.ls("/ckpt/step-1")}
        assert names == {".metadata", "__0_0.distcp", ".graben"}
        assert [e.path for e in client.ls("/ckpt")] == ["/ckpt/step-1"]  # no staging left


def test_a_save_is_one_publishing_rename(home: Path) -> None:
    """A rank's file, index and metadata are not committed by the rank: the coordinator
    commits them with its two files and the rename that publishes them, one metadata
    write for a save."""
    from collections import Counter

    from graben.store.transport import Commit, Rename

    sent: Counter[str] = Counter()
    with connect(home) as client:
        request = client.aio.meta.request

        async def counted(req: object) -> object:
            sent[type(req).__name__] += 1
            return await request(req)  # type: ignore[arg-type]

        client.aio.meta.request = counted  # type: ignore[method-assign]
        state = _state()
        writer = GrabenWriter("graben:///ckpt/step-1", client=client)
        dcp.save(state, storage_writer=writer, no_dist=True)
    assert (sent[Commit.__name__], sent[Rename.__name__]) == (0, 1)
    _assert_same(_load("graben:///ckpt/step-1", state), state)


def test_dcps_own_reader_reads_a_graben_checkpoint(home: Path, tmp_path: Path) -> None:
    state = _state()
    _save("graben:///ckpt/s", state)
    local = tmp_path / "export"
    with connect(home) as client:
        for entry in client.ls("/ckpt/s"):
            if entry.kind == "file":
                local.mkdir(exist_ok=True)
                (local / entry.path.rsplit("/", 1)[1]).write_bytes(client.get(entry.path))
    out = _zeros_like(state)
    dcp.load(out, storage_reader=FileSystemReader(str(local)), no_dist=True)
    _assert_same(out, state)


def test_graben_reader_reads_a_checkpoint_of_dcps_fsspec_writer(home: Path) -> None:
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    state = _state()
    dcp.save(state, storage_writer=FsspecWriter("graben:///stock/s"), no_dist=True)
    _assert_same(_load("graben:///stock/s", state), state)


def test_a_frozen_half_is_not_uploaded_again(home: Path) -> None:
    gen = torch.Generator().manual_seed(1)
    frozen = {f"frozen.{i}": torch.randn(256, 256, generator=gen) for i in range(4)}
    trained = {f"trained.{i}": torch.randn(256, 256, generator=gen) for i in range(4)}
    _save("graben:///run/step-1", {**frozen, **trained})
    first = _chunk_bytes(home)
    trained = {k: v + 1 for k, v in trained.items()}
    _save("graben:///run/step-2", {**frozen, **trained})
    added = _chunk_bytes(home) - first
    assert 0.4 * first < added < 0.6 * first, (first, added)
    state = {**frozen, **trained}
    _assert_same(_load("graben:///run/step-2", state), state)


def test_overwrite_replaces_the_whole_checkpoint_or_refuses(home: Path) -> None:
    old, new = _state(1), {"only": torch.ones(3)}
    _save("graben:///c", old)
    _save("graben:///c", new)
    _assert_same(_load("graben:///c", new), new)
    with connect(home) as client:  # nothing of the old checkpoint is left in it
        assert {e.path for e in client.ls("/c")} == {
            "/c/.metadata",
            "/c/__0_0.distcp",
            "/c/.graben",
        }
    with pytest.raises(CheckpointException, match="exists and overwrite=False"):
        _save("graben:///c", old, overwrite=False)
    _assert_same(_load("graben:///c", new), new)


def test_a_damaged_file_is_caught(home: Path) -> None:
    state = {"w": torch.randn(512, 512)}
    _save("graben:///d", state)
    for chunk in (home / "chunks").rglob("*"):
        if chunk.is_file() and chunk.stat().st_size > 100_000:
            data = bytearray(chunk.read_bytes())
            data[50_000] ^= 0xFF
            chunk.write_bytes(bytes(data))
    with pytest.raises(CheckpointException, match="crc32c") as caught:
        _load("graben:///d", state)
    assert IntegrityError.__name__ in str(caught.value)


def test_async_save(home: Path) -> None:
    state = _state()
    future = dcp.async_save(state, storage_writer=GrabenWriter("graben:///a/1"), no_dist=True)
    future.result()
    _assert_same(_load("graben:///a/1", state), state)


def test_bad_checkpoint_ids_are_refused() -> None:
    assert GrabenWriter.validate_checkpoint_id("graben://h:1/x")
    assert not GrabenWriter.validate_checkpoint_id("/local/path")
    with pytest.raises(ValueError, match="below the root"):
        GrabenWriter("graben:///")


def test_a_corrupt_replica_on_a_cluster_is_skipped(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, nodes=3)
    try:
        state = {"w": torch.randn(256, 256), "b": torch.randn(256)}
        url = f"{cluster.url}/ckpt/step-1"
        _save(url, state)
        for victim in cluster.chunk_files(0):
            victim.write_bytes(b"rot" + victim.read_bytes()[3:])
        _assert_same(_load(url, state), state)
    finally:
        cluster.close()


@pytest.mark.slow
def test_four_ranks_save_and_four_two_one_load(cluster_url: str) -> None:
    """Saved twice by 4 ranks (the second reusing the plan), loaded by 4, 2 and 1.

    Each loading rank reads the metadata of the rank files it needs, never
    the whole world's.
    """
    url = f"{cluster_url}/dtensor-{uuid.uuid4().hex[:8]}/step-1"
    saved = run_ranks(RANKS, "steps", url, 4)
    assert_ok(saved)
    assert all("reused=True" in out for _, out in saved), saved
    for world in (4, 2, 1):
        loaded = run_ranks(RANKS, "load", url, world)
        assert_ok(loaded)
        for rank, (_, out) in enumerate(loaded):
            read = json.loads(out.strip().splitlines()[-1])
            assert not read["full"], (world, rank, out)
            own = set(range(rank * 4 // world, (rank + 1) * 4 // world))
            assert own <= set(read["files"]), (world, rank, read)
            # beyond its own, at most the files holding the two scalar items
            assert len(read["files"]) <= len(own) + 2, (world, rank, read)


def test_metadata_is_dcps_own(home: Path) -> None:
    _save("graben:///m", _state())
    with connect(home) as client:
        metadata = pickle.load(io.BytesIO(client.get("/m/.metadata")))
    assert type(metadata).__module__ == "torch.distributed.checkpoint.metadata"
    assert {type(v).__name__ for v in metadata.storage_data.values()} == {"_StorageInfo"}


def test_zstd_checkpoints_are_smaller_and_read_by_dcp_too(home: Path, tmp_path: Path) -> None:
    state = {**_state(), "zeros": torch.zeros(256, 256), "steps": torch.arange(65536)}
    _save("graben:///z", state, compression=3)
    _save("graben:///plain", state)
    with connect(home) as client:
        assert client.du("/z")[1] < 0.7 * client.du("/plain")[1]
        local = tmp_path / "z"
        local.mkdir()
        for entry in client.ls("/z"):
            if entry.kind == "file":
                (local / entry.name).write_bytes(client.get(entry.path))
    _assert_same(_load("graben:///z", state), state)
    out = _zeros_like(state)
    dcp.load(out, storage_reader=FileSystemReader(str(local)), no_dist=True)
    _assert_same(out, state)


def test_the_coordinator_commits_no_file_a_rank_names_outside_its_own() -> None:
    """A rank's results name its files for the coordinator to commit: a file at any other
    name (another rank's, another checkpoint's, anywhere) is refused before anything is
    committed."""
    from graben.checkpoint._writer import _ranks_files, _Results, _results
    from graben.store import FileCommit

    staging = "/ckpt/.s.saving-1"

    def sent(rank: int, *paths: str) -> _Results:
        return _results([], b"m", b"", [FileCommit(p, ()) for p in paths])

    own = [f"{staging}/__1_0.distcp", f"{staging}/.graben/__1.metadata"]
    files = _ranks_files(staging, [sent(0, f"{staging}/__0_0.distcp"), sent(1, *own)])
    assert [f.path for f in files] == [f"{staging}/__0_0.distcp", *own]
    for wrong in (f"{staging}/__0_0.distcp", "/ckpt/s/__1_0.distcp", "/etc/x", f"{staging}/../x"):
        with pytest.raises(InvalidArgument, match="outside its own"):
            _ranks_files(staging, [sent(0), sent(1, wrong)])
