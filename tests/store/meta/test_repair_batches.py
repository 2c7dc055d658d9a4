"""How a round of repair splits the short chunks into batches copied at once."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from graben.store._types import ChunkRef
from graben.store.meta._repair import REPAIR_BYTES, REPAIR_CHUNKS, _repair_batches
from graben.store.meta._repo import Degraded


def _short(i: int, length: int) -> Degraded:
    return Degraded(ChunkRef(f"c{i}", length, 0), ("n1",), 3)


@given(st.lists(st.integers(0, 3 * REPAIR_BYTES // 2), max_size=200))
def test_every_short_chunk_is_in_one_batch_in_order_within_the_bounds(
    lengths: list[int],
) -> None:
    degraded = [_short(i, n) for i, n in enumerate(lengths)]
    batches = list(_repair_batches(degraded))
    assert [d for batch in batches for d in batch] == degraded
    for batch in batches:
        assert batch
        assert len(batch) <= REPAIR_CHUNKS
        held = sum(d.chunk.length for d in batch)
        assert held <= REPAIR_BYTES or len(batch) == 1  # one chunk larger than the bound


def test_small_chunks_go_a_full_batch_at_a_time() -> None:
    batches = list(_repair_batches([_short(i, 4096) for i in range(3 * REPAIR_CHUNKS + 1)]))
    assert [len(b) for b in batches] == [REPAIR_CHUNKS] * 3 + [1]
