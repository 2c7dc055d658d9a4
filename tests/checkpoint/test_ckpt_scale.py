"""DCP's planning and metadata path at 4096 simulated ranks x 300 tensors, in one process.

``make test`` runs it at 512 ranks (4096 take minutes: ``pytest -m huge``).

The real planner and writer calls of ``dcp.save`` run for every simulated
rank (``graben.bench._plan_sim``); collectives and tensor data are left
out. The times are printed; ``graben bench ckpt-plan`` compares them with
stock DCP. The test checks what makes them small: the second save sends
placeholders instead of plans and writes the same metadata, and a loading
rank reads only its own rank file's metadata, resharded or not.
"""

from __future__ import annotations

import gc
import statistics
from pathlib import Path

import pytest

from graben.bench._plan_sim import ROWS, Times, graben_kind, quiet_gc, simulate_load, simulate_saves
from graben.checkpoint import GrabenReader
from graben.store import connect

TENSORS = 300


def _report(label: str, times: Times) -> str:
    return (
        f"{label}: {times.total:.3f} s (rank plan {statistics.fmean(times.rank_plan) * 1e3:.1f} ms,"
        f" gather {times.gather:.3f} s of {times.gathered_bytes / 1e6:.1f} MB,"
        f" global plan {times.global_plan:.3f} s, scatter {times.scatter:.3f} s,"
        f" rank write {statistics.fmean(times.rank_write) * 1e3:.1f} ms,"
        f" results {times.results:.3f} s, commit {times.commit:.3f} s)"
    )


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """Memory-backed when the machine has it: 4096 ranks' metadata files, one at a time."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        return tmp_path / "store"
    import tempfile

    return Path(tempfile.mkdtemp(prefix="graben-scale-", dir=shm))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [512, pytest.param(4096, marks=pytest.mark.huge)])
def test_ranks_plan_once_then_reuse(
    store_dir: Path, capsys: pytest.CaptureFixture[str], world: int
) -> None:
    import shutil

    try:
        with connect(str(store_dir)) as client, quiet_gc():
            kind = graben_kind(client, "/scale")
            first, second = simulate_saves(kind, world, TENSORS, 2)
            with capsys.disabled():
                print(f"\n{world} ranks x {TENSORS} tensors")
                print(_report("first save", first))
                print(_report("second save", second))
            # every rank sent a placeholder, not its 300 items
            assert second.gathered_bytes < first.gathered_bytes / 100
            for name in (".metadata", ".graben/directory"):
                assert client.get(f"/scale/step-1/{name}") == client.get(f"/scale/step-0/{name}")
            _check_loads(client, capsys, world)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
        gc.collect()


def _check_loads(client: object, capsys: pytest.CaptureFixture[str], saved_by: int) -> None:
    for world, rows in ((saved_by, ROWS), (saved_by // 2, 2 * ROWS)):
        for rank in (0, world // 3, world - 1):
            reader = GrabenReader("graben:///scale/step-1", client=client)  # type: ignore[arg-type]
            seconds, plan = simulate_load(reader, rank, world, TENSORS, rows)
            with capsys.disabled():
                print(f"load plan, rank {rank} of {world}: {seconds * 1e3:.1f} ms")
            saved = list(range(rank * saved_by // world, (rank + 1) * saved_by // world))
            assert reader.ranked is not None
            assert reader.ranked.rank_files_read == saved
            assert not reader.ranked.read_full
            assert len(plan.items) == TENSORS * len(saved)
            files = {
                reader.ranked.metadata.storage_data[i.storage_index].relative_path
                for i in plan.items
            }
            assert files == {f"__{r}_0.distcp" for r in saved}
