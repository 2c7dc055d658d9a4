"""A state dict written as one memory-tier segment and read back (a file, no agent)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import blake3
import pytest
import torch

from graben.checkpoint._segment import (
    Layout,
    Mappings,
    Sums,
    Unholdable,
    holdable,
    layout,
    load,
    ranges,
    views_of,
    write_into,
)
from graben.store import IntegrityError, InvalidArgument


class Counter:
    """A ``Stateful``: held as its state dict, loaded back through ``load_state_dict``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n, "seen": torch.full((4,), self.n)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = state["n"]
        assert torch.equal(state["seen"], torch.full((4,), self.n))


def state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(64, 32, generator=g)
    return {
        "model": {"w": torch.randn(128, 64, generator=g), "b": torch.zeros(0)},
        "optim": {"state": {0: {"momentum": torch.randn(7, generator=g)}}, "lr": 0.1 * seed},
        "half": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "strided": wide.t(),  # not contiguous: written as its values
        "pair": (torch.tensor([seed]), "text"),
        "counter": Counter(seed),
        "step": seed,
    }


def hashed(path: str, lay: Layout) -> Sums:
    """What the agent hashes of a segment once its writer is done."""
    data = Path(path).read_bytes()
    return [(o, n, blake3.blake3(data[o : o + n]).digest()) for o, n in ranges(lay)]


def written(tmp_path: Path, value: dict[str, Any]) -> tuple[str, Sums, Layout]:
    """A segment of ``value`` written as a rank writes it: its path, sums and layout."""
    lay = layout(value)
    path = tmp_path / "segment"
    path.write_bytes(b"")
    with open(path, "r+b") as f:
        f.truncate(lay.size)
    with Mappings() as maps:
        memory = maps.of(str(path), lay.size)  # as a rank writes it
        write_into(memory, lay)
    return str(path), hashed(str(path), lay), lay


def test_a_state_dict_comes_back_in_place(tmp_path: Path) -> None:
    saved = state(3)
    path, sum_, _ = written(tmp_path, saved)
    target = state(5)
    w = target["model"]["w"]
    load(path, sum_, target)
    assert target["model"]["w"] is w and torch.equal(w, saved["model"]["w"])  # in place
    assert torch.equal(
        target["optim"]["state"][0]["momentum"], saved["optim"]["state"][0]["momentum"]
    )
    assert target["optim"]["lr"] == 0.1 * 3 and target["step"] == 3
    assert torch.equal(target["half"], saved["half"]) and target["half"].dtype == torch.bfloat16
    assert torch.equal(target["strided"], saved["strided"])
    assert torch.equal(target["pair"][0], torch.tensor([3])) and target["pair"][1] == "text"
    assert target["counter"].n == 3


def test_views_are_the_segment_s_own_memory(tmp_path: Path) -> None:
    saved = state(2)
    path, _, lay = written(tmp_path, saved)
    with Mappings() as maps:
        seen = views_of(maps.of(path, Path(path).stat().st_size), lay)
    assert torch.equal(seen["model"]["w"], saved["model"]["w"])
    assert torch.equal(seen["counter"]["seen"], torch.full((4,), 2)) and seen["step"] == 2
    w = seen["model"]["w"]
    assert w.untyped_storage().nbytes() == w.nbytes and w.storage_offset() == 0  # uploaded as is


def test_a_state_dict_of_another_shape_is_refused(tmp_path: Path) -> None:
    path, sum_, _ = written(tmp_path, {"w": torch.zeros(4, 4)})
    with pytest.raises(InvalidArgument, match=r"shape \[4, 4\]"):
        load(path, sum_, {"w": torch.zeros(4, 5)})
    with pytest.raises(InvalidArgument, match="lacks"):
        load(path, sum_, {"w": torch.zeros(4, 4), "extra": torch.zeros(1)})


class Sharded(torch.Tensor):
    """Stands in for DTensor: a tensor subclass, whose memory is not all of it."""


def test_tensor_subclasses_are_not_held() -> None:
    assert holdable(state(1)) and holdable({"p": torch.nn.Parameter(torch.zeros(2))})
    assert not holdable({"deep": [{"w": torch.zeros(2).as_subclass(Sharded)}]})


def test_views_outlive_the_mappings_that_made_them(tmp_path: Path) -> None:
    saved = state(4)
    path, _, lay = written(tmp_path, saved)
    maps = Mappings()
    seen = views_of(maps.of(path, Path(path).stat().st_size), lay)
    maps.close()  # the rank closes its tier; a save to the store may still hold views
    Path(path).unlink()  # and the agent may drop the file meanwhile
    assert torch.equal(seen["model"]["w"], saved["model"]["w"])  # no unmapped memory read


def test_a_changed_segment_is_refused(tmp_path: Path) -> None:
    saved = state(3)
    path, sum_, lay = written(tmp_path, saved)
    w_at = next(offset for tensor, offset in lay.tensors if tensor.shape == (128, 64))
    with open(path, "r+b") as f:  # one float of the weights, patched
        f.seek(w_at + 4 * 100)
        f.write(torch.tensor([1e6]).numpy().tobytes())
    target = state(5)
    with pytest.raises(IntegrityError, match="bytes at /model/w differ"):
        load(path, sum_, target)
    assert target["counter"].n == 5  # no load_state_dict called with what was refused
    with pytest.raises(IntegrityError, match="header's bytes differ"):
        load(path, [], state(5))  # nothing hashed: nothing checked, nothing loaded


def test_a_forged_header_is_refused_unread(tmp_path: Path) -> None:
    path, sum_, lay = written(tmp_path, {"w": torch.ones(16), "step": 7})
    forged = layout({"w": torch.ones(16), "step": 8}).header  # the same length, a new step
    assert len(forged) == len(lay.header)
    with open(path, "r+b") as f:
        f.write(forged)
    target = {"w": torch.zeros(16), "step": 0}
    with pytest.raises(IntegrityError, match="header's bytes differ"):
        load(path, sum_, target)
    assert target["step"] == 0 and not target["w"].any()
    with open(path, "r+b") as f:  # a length past the file's end
        f.write((1 << 40).to_bytes(8, "little"))
    with pytest.raises(IntegrityError, match="header's length"):
        load(path, sum_, target)


class Opaque:
    """A value only pickle could keep: a segment does not."""


@pytest.mark.parametrize("value", [Opaque(), {1.5j: 1}, {"k": {frozenset(): 1}}, 1 << 70])
def test_values_only_pickle_could_keep_are_not_held(value: object) -> None:
    with pytest.raises(Unholdable, match="memory tier"):
        layout({"w": torch.zeros(2), "other": value})
