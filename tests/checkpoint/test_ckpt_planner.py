"""GrabenSavePlanner / GrabenLoadPlanner and the metadata kept by rank file.

In-process saves and loads (DCP's ``no_dist`` mode) plus the pure parts;
real gloo ranks are in ``test_checkpoint.py``, the 4096-rank path in
``test_ckpt_scale.py``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

from graben.checkpoint import GrabenLoadPlanner, GrabenReader, GrabenSavePlanner, GrabenWriter
from graben.checkpoint._ranked import Directory, Held, RankedMetadata, covers, guess
from graben.store import connect

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GRABEN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRABEN_URL", raising=False)
    return tmp_path / "home"


def _state(scale: float, layers: int = 3) -> dict[str, object]:
    return {
        "model": {f"l{i}": torch.full((8, 4), scale * (i + 1)) for i in range(layers)},
        "step": int(scale),
    }


def _chunk(offsets: list[int], sizes: list[int]) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes))


def test_the_second_save_reuses_the_plan_and_both_load(home: Path) -> None:
    planner = GrabenSavePlanner()
    for step in (1, 2):
        writer = GrabenWriter(f"graben:///run/step-{step}")
        dcp.save(_state(step), storage_writer=writer, planner=planner, no_dist=True)
        assert planner.reused == (step == 2)
    for step in (1, 2):
        loaded = _state(0)
        dcp.load(loaded, storage_reader=GrabenReader(f"graben:///run/step-{step}"), no_dist=True)
        assert torch.equal(loaded["model"]["l2"], torch.full((8, 4), step * 3.0))  # type: ignore[index]
        assert loaded["step"] == step


def test_a_changed_layout_is_planned_again(home: Path) -> None:
    planner = GrabenSavePlanner()
    dcp.save(_state(1), storage_writer=GrabenWriter("graben:///a/1"), planner=planner, no_dist=True)
    bigger = _state(2, layers=4)
    dcp.save(bigger, storage_writer=GrabenWriter("graben:///a/2"), planner=planner, no_dist=True)
    assert not planner.reused
    loaded = _state(0, layers=4)
    dcp.load(loaded, storage_reader=GrabenReader("graben:///a/2"), no_dist=True)
    assert torch.equal(loaded["model"]["l3"], torch.full((8, 4), 8.0))  # type: ignore[index]


def test_a_stock_caching_planner_is_refused_not_misdirected(home: Path) -> None:
    """DCP's own plan cache keeps the first save's storage part: the writer says so."""
    planner = DefaultSavePlanner(enable_plan_caching=True)
    planner._cached_plans_key = "graben-test-stale"  # its cache is per class: keep it to this test
    dcp.save(_state(1), storage_writer=GrabenWriter("graben:///s/1"), planner=planner, no_dist=True)
    with pytest.raises(CheckpointException, match="stale plan"):
        dcp.save(
            _state(2), storage_writer=GrabenWriter("graben:///s/2"), planner=planner, no_dist=True
        )
    with connect(str(home)) as client:
        assert not client.exists("/s/2")


@pytest.mark.parametrize("planner", [GrabenLoadPlanner, DefaultLoadPlanner])
def test_loading_reads_by_rank_with_the_graben_planner_else_whole(
    home: Path, planner: type
) -> None:
    dcp.save(_state(5), storage_writer=GrabenWriter("graben:///r/1"), no_dist=True)
    reader, loaded = GrabenReader("graben:///r/1"), _state(0)
    dcp.load(loaded, storage_reader=reader, planner=planner(), no_dist=True)
    assert torch.equal(loaded["model"]["l0"], torch.full((8, 4), 5.0))  # type: ignore[index]
    assert reader.ranked is not None
    assert reader.ranked.read_full == (planner is DefaultLoadPlanner)
    if planner is GrabenLoadPlanner:
        assert reader.ranked.rank_files_read == [0]


def test_guess_is_proportional_along_the_cut_dimension() -> None:
    rows = Held([(0, 8)], [64, 4])
    assert guess(rows, _chunk([16, 0], [8, 4])) == [2]
    assert guess(rows, _chunk([16, 0], [8, 4]), slack=1) == [1, 2, 3]
    assert guess(rows, _chunk([12, 0], [24, 4])) == [1, 2, 3, 4]
    columns = Held([(0, 2), (5, 7)], [4, 64])  # held by rank files 0, 1, 5, 6
    assert guess(columns, _chunk([0, 48], [4, 16])) == [6]
    assert guess(columns, _chunk([0, 0], [4, 64])) == [0, 1, 5, 6]  # the whole tensor
    assert guess(Held([(3, 4)], None), None) == [3]


def test_covers_counts_the_overlapping_volume() -> None:
    halves = [_chunk([0, 0], [4, 8]), _chunk([4, 0], [4, 8])]
    assert covers(halves, _chunk([2, 2], [4, 4]))
    assert not covers(halves[:1], _chunk([2, 2], [4, 4]))
    assert covers([_chunk([], [])], _chunk([], []))  # a scalar


def test_a_wrong_guess_falls_back_to_the_full_metadata(home: Path) -> None:
    """Rank files that do not hold their rows in order: the guess misses, the load is right."""
    chunks = [_chunk([8 * k, 0], [8, 4]) for k in range(4)]
    directory = Directory(4, {"w": Held([(0, 4)], [32, 4])}, b"\x80\x04N.")
    reads: list[int] = []

    def rank(r: int) -> Metadata:
        reads.append(r)
        held = chunks[3 - r]  # rank file r holds the rows of 3 - r
        entry = TensorStorageMetadata(TensorProperties(), torch.Size([32, 4]), [held])
        return Metadata({"w": entry}, storage_data={})

    def full() -> Metadata:
        return Metadata(
            {"w": TensorStorageMetadata(TensorProperties(), torch.Size([32, 4]), chunks)}
        )

    ranked = RankedMetadata(directory, rank, full)
    ranked.want({"w": [chunks[0]]})
    assert not ranked.read_full
    entry = ranked.metadata.state_dict_metadata["w"]
    assert ranked.read_full  # the guesses (0, then 0 and 1) held other rows
    assert entry.chunks == chunks  # type: ignore[union-attr]
    assert reads == [0, 1]


def test_a_save_failing_after_the_global_plan_leaves_the_cache_as_the_ranks_have_it(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layout A saved; a save of layout B fails before the ranks take their plans;
    A again reuses A's plan, not B's: the checkpoint describes what was written."""
    planner = GrabenSavePlanner()
    dcp.save(_state(1), storage_writer=GrabenWriter("graben:///f/1"), planner=planner, no_dist=True)

    def broken(self: GrabenWriter, plans: list[object]) -> list[object]:
        raise OSError("the store went away")

    with monkeypatch.context() as patch:
        patch.setattr(GrabenWriter, "prepare_global_plan", broken)
        with pytest.raises(CheckpointException):
            bigger = _state(2, layers=5)
            dcp.save(
                bigger, storage_writer=GrabenWriter("graben:///f/2"), planner=planner, no_dist=True
            )
    dcp.save(_state(3), storage_writer=GrabenWriter("graben:///f/3"), planner=planner, no_dist=True)
    assert planner.reused
    reader, loaded = GrabenReader("graben:///f/3"), _state(0)
    dcp.load(loaded, storage_reader=reader, planner=GrabenLoadPlanner(), no_dist=True)
    assert torch.equal(loaded["model"]["l2"], torch.full((8, 4), 9.0))  # type: ignore[index]
    with connect(str(home)) as client:
        written = pickle.loads(client.get("/f/3/.metadata"))
    assert sorted(written.state_dict_metadata) == ["model.l0", "model.l1", "model.l2", "step"]
