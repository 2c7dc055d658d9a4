"""A rank's state dict as one segment of the memory tier, byte for byte.

Layout: 8 bytes giving the header's length, the header (the state dict's
skeleton, pickled: every tensor replaced by a ``_Slot`` naming its offset,
type and shape; every other value as it is), then each tensor's raw bytes at
its slot's offset (64-byte aligned). Writing is one ``copy_`` per tensor into
the mapped file (the only copy a save makes; ``Mappings`` keeps files mapped,
so a reused one costs no page faults); reading is ``preadv`` straight into each
target tensor, by a few threads. Read as views (``views_of``), a segment is a
state dict whose tensors are its own memory: the background save to the
store reads them there.

Plain tensors, containers of them (dicts, lists, tuples) and any picklable
value are held; a ``Stateful`` (an object with ``state_dict`` and
``load_state_dict``, as DCP takes) is held as its state dict and loaded back
through ``load_state_dict``. Tensor subclasses (``DTensor``) are not: the
caller checks ``holdable`` first and saves such state to the store.
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from graben.store import InvalidArgument

from ._format import tensor_bytes

ALIGN = 64
READERS = 4
"""Threads reading one segment back (``preadv`` lets go of the GIL)."""
READ_PIECE = 8 << 20
"""Bytes of one read."""
_LENGTH = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where a tensor's bytes lie in the segment."""

    offset: int
    """Start of its bytes, from the end of the header (64-byte aligned)."""
    dtype: str
    """Its element type (``torch.float32`` as ``"float32"``)."""
    shape: tuple[int, ...]
    """Its shape."""


@dataclass(frozen=True, slots=True)
class _Stateful:
    """A ``Stateful`` object's state dict, loaded back through its ``load_state_dict``."""

    state: Any


@dataclass(frozen=True, slots=True)
class Layout:
    """A state dict laid out as a segment: the bytes before the data, and each tensor's place."""

    header: bytes
    """The length prefix and the pickled skeleton."""
    tensors: list[tuple[torch.Tensor, int]]
    """Each tensor (contiguous, on the CPU) and its offset."""
    size: int
    """Bytes of the whole segment."""


def holdable(state_dict: Any) -> bool:
    """Whether every tensor in ``state_dict`` is a plain one (no ``DTensor`` and the like)."""
    return all(
        type(t) is torch.Tensor or type(t) is torch.nn.Parameter for t in _tensors(state_dict)
    )


def layout(state_dict: Any) -> Layout:
    """How ``state_dict`` is written (tensors on another device are copied to the CPU)."""
    tensors: list[tuple[torch.Tensor, int]] = []
    position = [0]

    def slot(tensor: torch.Tensor) -> _Slot:
        tensor = tensor.detach()
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            tensor = tensor.to("cpu", memory_format=torch.contiguous_format)
        at = position[0]
        tensors.append((tensor, at))
        position[0] = _aligned(at + tensor.nbytes)
        return _Slot(at, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))

    skeleton = pickle.dumps(_map(state_dict, slot), protocol=pickle.HIGHEST_PROTOCOL)
    start = _aligned(_LENGTH.size + len(skeleton))
    header = _LENGTH.pack(len(skeleton)) + skeleton
    tensors = [(t, start + at) for t, at in tensors]
    return Layout(header, tensors, start + position[0])


def write_into(memory: mmap.mmap, layout: Layout) -> None:
    """Copy ``layout`` into a mapped segment: each tensor by ``copy_``, as a stager would."""
    memory[: len(layout.header)] = layout.header
    for tensor, offset in layout.tensors:
        if tensor.nbytes:
            into = torch.frombuffer(memory, dtype=torch.uint8, count=tensor.nbytes, offset=offset)
            into.copy_(tensor.reshape(-1).view(torch.uint8))


class Mappings:
    """The segment files a rank has mapped, by inode, kept mapped.

    The agent hands a rank's next save the file of a step it dropped (its
    pages are already there); mapped already, the copy into it touches no
    page the kernel must find or map first: it runs at ``copy_``'s speed.
    A mapping whose file the agent removed is let go at the next ``of``
    (until then, and while a view of it lives, it holds that file's memory).
    """

    def __init__(self) -> None:
        self._maps: dict[tuple[int, int], tuple[int, mmap.mmap]] = {}

    def of(self, path: str, size: int) -> mmap.mmap:
        """``path`` mapped (``size`` bytes), reusing this rank's mapping of the same file."""
        self._release_removed()
        fd = os.open(path, os.O_RDWR)
        stat = os.fstat(fd)
        key = (stat.st_dev, stat.st_ino)
        known = self._maps.get(key)
        if known is not None and len(known[1]) == size:
            os.close(fd)
            return known[1]
        if known is not None:
            self._close(key)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        memory = mmap.mmap(fd, size, flags=flags) if size else mmap.mmap(-1, 1)
        self._maps[key] = (fd, memory)
        return memory

    def _release_removed(self) -> None:
        for key, (fd, _) in list(self._maps.items()):
            if os.fstat(fd).st_nlink == 0:
                self._close(key)

    def _close(self, key: tuple[int, int]) -> None:
        # Never ``mmap.close()``: torch's views of a mapping keep the object alive but not
        # a buffer export, so closing would unmap memory tensors still point into. Once
        # forgotten here, it is unmapped when the last view goes.
        fd, _ = self._maps.pop(key)
        os.close(fd)

    def close(self) -> None:
        for key in list(self._maps):
            self._close(key)

    def __enter__(self) -> Mappings:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: str, state_dict: dict[str, Any]) -> None:
    """Load the segment at ``path`` into ``state_dict`` in place (as ``dcp.load`` does)."""
    with open(path, "rb") as f, ThreadPoolExecutor(READERS, "graben-segment") as pool:
        skeleton, start = _skeleton(f.fileno())
        segment = _Reader(f.fileno(), start, pool)
        _restore(segment, skeleton, state_dict, "")
        for read in segment.reads:
            read.result()
        for then in segment.after:
            then()


def views_of(memory: mmap.mmap) -> Any:
    """A mapped segment as a state dict whose tensors are views of its memory."""
    (length,) = _LENGTH.unpack(memory[: _LENGTH.size])
    skeleton = pickle.loads(memory[_LENGTH.size : _LENGTH.size + length])
    start = _aligned(_LENGTH.size + length)

    def view(slot: _Slot) -> torch.Tensor:
        dtype = _dtype(slot.dtype)
        count = _numel(slot.shape)
        if count == 0:
            return torch.empty(slot.shape, dtype=dtype)
        flat = torch.frombuffer(memory, dtype=dtype, count=count, offset=start + slot.offset)
        return flat.view(slot.shape)

    return _map_slots(skeleton, view)


# -- the walk ------------------------------------------------------------------------


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif _is_stateful(value):
        yield from _tensors(value.state_dict())


def _map(value: Any, slot: Any) -> Any:
    """``value`` with each tensor replaced by ``slot(tensor)``, each Stateful by its state."""
    if isinstance(value, torch.Tensor):
        return slot(value)
    if isinstance(value, dict):
        return {k: _map(v, slot) for k, v in value.items()}
    if isinstance(value, list):
        return [_map(v, slot) for v in value]
    if isinstance(value, tuple):
        return tuple(_map(v, slot) for v in value)
    if _is_stateful(value):
        return _Stateful(_map(value.state_dict(), slot))
    return value


def _map_slots(value: Any, make: Any) -> Any:
    if isinstance(value, _Slot):
        return make(value)
    if isinstance(value, _Stateful):
        return _map_slots(value.state, make)
    if isinstance(value, dict):
        return {k: _map_slots(v, make) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_map_slots(v, make) for v in value)
    return value


@dataclass(slots=True)
class _Reader:
    """An open segment being read into a state dict: where its data starts, the reads
    under way, and what waits for them (copies into tensors of another type, and each
    ``Stateful``'s ``load_state_dict``)."""

    fd: int
    start: int
    pool: ThreadPoolExecutor
    reads: list[Future[None]] = field(default_factory=list)
    after: list[Callable[[], object]] = field(default_factory=list)


def _restore(segment: _Reader, saved: Any, target: Any, where: str) -> Any:
    """``target`` with ``saved`` loaded into it: tensors in place, other values replaced."""
    if isinstance(saved, _Slot):
        if not isinstance(target, torch.Tensor):
            raise InvalidArgument(f"the memory tier holds a tensor at {where or '/'}; not here")
        _read_tensor(segment, saved, target, where)
        return target
    if isinstance(saved, _Stateful):
        if not _is_stateful(target):
            raise InvalidArgument(f"the memory tier holds a Stateful's state at {where}")
        restored = _restore(segment, saved.state, target.state_dict(), where)
        segment.after.append(partial(target.load_state_dict, restored))
        return target
    if isinstance(saved, dict) and isinstance(target, dict):
        missing = set(target) - set(saved)
        if missing:
            raise InvalidArgument(
                f"the memory tier's step lacks {sorted(map(str, missing))[:3]} under {where or '/'}"
            )
        for key in target:
            target[key] = _restore(segment, saved[key], target[key], f"{where}/{key}")
        return target
    if isinstance(saved, list) and isinstance(target, list) and len(saved) == len(target):
        for i, item in enumerate(saved):
            target[i] = _restore(segment, item, target[i], f"{where}/{i}")
        return target
    if isinstance(saved, tuple) and isinstance(target, tuple) and len(saved) == len(target):
        pairs = enumerate(zip(saved, target, strict=True))
        return tuple(_restore(segment, s, t, f"{where}/{i}") for i, (s, t) in pairs)
    return saved


def _read_tensor(segment: _Reader, slot: _Slot, target: torch.Tensor, where: str) -> None:
    dtype = _dtype(slot.dtype)
    if tuple(target.shape) != slot.shape:
        raise InvalidArgument(
            f"the memory tier's tensor at {where} has shape {list(slot.shape)}, "
            f"the state dict's {list(target.shape)}"
        )
    direct = target.device.type == "cpu" and target.is_contiguous() and target.dtype == dtype
    into = target.detach() if direct else torch.empty(slot.shape, dtype=dtype)
    view = tensor_bytes(into)
    for at in range(0, view.nbytes, READ_PIECE):  # read by several threads: one is ~half
        piece = view[at : at + READ_PIECE]  # the speed of memory here
        where_at = segment.start + slot.offset + at
        segment.reads.append(segment.pool.submit(_read_into, segment.fd, piece, where_at, where))
    if not direct:
        segment.after.append(partial(target.detach().copy_, into))


def _read_into(fd: int, view: memoryview, offset: int, where: str) -> None:
    done = 0
    while done < view.nbytes:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise InvalidArgument(f"the memory tier's segment ends early at {where}")
        done += n


def _skeleton(fd: int) -> tuple[Any, int]:
    """The segment's skeleton, and where its data starts."""
    (length,) = _LENGTH.unpack(os.pread(fd, _LENGTH.size, 0))
    return pickle.loads(os.pread(fd, length, _LENGTH.size)), _aligned(_LENGTH.size + length)


def _is_stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise InvalidArgument(f"the memory tier holds an unknown type {name!r}")
    return dtype


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count
