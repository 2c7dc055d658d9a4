"""A rank's state dict as one segment of the memory tier, byte for byte.

Layout: 8 bytes giving the header's length, the header (the state dict's
skeleton as msgpack: every tensor replaced by a ``_Slot`` naming its offset,
type and shape; containers and plain values, None, bool, int, float, str and
bytes, as they are), then each tensor's raw bytes at its slot's offset
(64-byte aligned). Nothing read from a segment is unpickled: whoever could
write shared memory would otherwise run code in every rank that loads it.
Writing is one ``copy_`` per tensor into the mapped file (the only copy a save
makes; ``Mappings`` keeps files mapped, so a reused one costs no page faults);
reading is ``preadv`` straight into each target tensor, by a few threads.
Read as views (``views_of``), a segment is a state dict whose tensors are its
own memory: the background save to the store reads them there.

What a reader checks: the writer names the ranges a reader will read
(``ranges``: the header, and each tensor cut every ``PIECE`` bytes from its
start) when it tells the agent the segment is done; the agent hashes them
then (blake3) and hands a reader the sums with the file. ``load`` checks the
header before decoding it (plain values come from it) and each piece as it
lands, and refuses a segment that differs (``IntegrityError``) before any
``load_state_dict`` or copy into a tensor of another type (a tensor read in place
may hold the refused bytes by then: the caller loads another step, or fails).

Plain tensors, containers of them (dicts, lists, tuples) and plain values are
held; a ``Stateful`` (an object with ``state_dict`` and ``load_state_dict``,
as DCP takes) is held as its state dict and loaded back through
``load_state_dict``. Tensor subclasses (``DTensor``) are not: the caller
checks ``holdable`` first and saves such state to the store, as it does a
state dict ``layout`` refuses (``Unholdable``: another value).

Over 500 lines: the format is written and read here, in one place.
"""

from __future__ import annotations

import hmac
import mmap
import os
import stat
import struct
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeAlias

import blake3
import msgspec
import torch

from graben.store import IntegrityError, InvalidArgument, PermissionDenied

from ._format import tensor_bytes

ALIGN = 64
READERS = 4
"""Threads reading one segment back (``preadv`` and blake3 let go of the GIL)."""
PIECE = 8 << 20
"""Bytes of one read, and of one piece of a tensor's digest."""
HASH_STRIDE = 256 << 10  # hashed as it lands: 6.7 GiB/s on 2 threads here, 6.1 whole
Sums = list[tuple[int, int, bytes]]
"""The agent's blake3 of each range a writer named: ``(offset, length, blake3)``."""
MAX_HEADER = 1 << 30
"""Most bytes of a header a reader takes."""
_LENGTH = struct.Struct("<Q")
_PLAIN = (type(None), bool, int, float, str)


class Unholdable(InvalidArgument):
    """A state dict holds a value a segment does not keep (it goes to the store)."""


class _Slot(msgspec.Struct, frozen=True, array_like=True, tag="t"):
    """Where a tensor's bytes lie in the segment."""

    offset: int
    """Start of its bytes, from the end of the header (64-byte aligned)."""
    dtype: str
    """Its element type (``torch.float32`` as ``"float32"``)."""
    shape: tuple[int, ...]
    """Its shape."""


class _Stateful(msgspec.Struct, frozen=True, array_like=True, tag="s"):
    """A ``Stateful`` object's state dict, loaded back through its ``load_state_dict``."""

    state: Node


class _Dict(msgspec.Struct, frozen=True, array_like=True, tag="d"):
    """A dict: its keys (plain values) and values, in order."""

    items: list[tuple[Plain, Node]]


class _List(msgspec.Struct, frozen=True, array_like=True, tag="l"):
    """A list."""

    items: list[Node]


class _Tuple(msgspec.Struct, frozen=True, array_like=True, tag="u"):
    """A tuple."""

    items: list[Node]


class _Value(msgspec.Struct, frozen=True, array_like=True, tag="v"):
    """A plain value."""

    value: Plain


class _Bytes(msgspec.Struct, frozen=True, array_like=True, tag="b"):
    """A bytes value (msgpack tells bytes from str, a union of both it does not)."""

    value: bytes


Plain: TypeAlias = bool | int | float | str | None
Node: TypeAlias = _Slot | _Stateful | _Dict | _List | _Tuple | _Value | _Bytes
_HEADER = msgspec.msgpack.Decoder(Node)


@dataclass(frozen=True, slots=True)
class Layout:
    """A state dict laid out as a segment: the bytes before the data, and each tensor's place."""

    header: bytes
    """The length prefix and the skeleton."""
    skeleton: Node
    """The state dict with each tensor as its slot."""
    tensors: list[tuple[torch.Tensor, int]]
    """Each tensor (contiguous, on the CPU) and its offset, in the order of their offsets."""
    size: int
    """Bytes of the whole segment."""


def holdable(state_dict: Any) -> bool:
    """Whether every tensor in ``state_dict`` is a plain one (no ``DTensor`` and the like)."""
    return all(
        type(t) is torch.Tensor or type(t) is torch.nn.Parameter for t in _tensors(state_dict)
    )


def layout(state_dict: Any) -> Layout:
    """How ``state_dict`` is written (tensors on another device are copied to the CPU);
    ``Unholdable`` if it holds a value other than those the module docstring names."""
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

    skeleton = _node(state_dict, slot, "")
    try:
        encoded = msgspec.msgpack.encode(skeleton)
    except (OverflowError, TypeError, ValueError) as exc:
        raise Unholdable(f"the memory tier cannot keep a value of the state dict ({exc})") from None
    start = _aligned(_LENGTH.size + len(encoded))
    header = _LENGTH.pack(len(encoded)) + encoded
    tensors = [(t, start + at) for t, at in tensors]
    return Layout(header, skeleton, tensors, start + position[0])


def write_into(memory: mmap.mmap, layout: Layout) -> None:
    """Copy ``layout`` into a mapped segment: each tensor by ``copy_``, as a stager would."""
    memory[: len(layout.header)] = layout.header
    for tensor, offset in layout.tensors:
        if tensor.nbytes:
            into = torch.frombuffer(memory, dtype=torch.uint8, count=tensor.nbytes, offset=offset)
            into.copy_(tensor.reshape(-1).view(torch.uint8))


def ranges(layout: Layout) -> list[tuple[int, int]]:
    """What a reader of ``layout``'s segment reads, ``(offset, length)`` each: the agent
    hashes these once the segment is done."""
    pieces = _pieces((t.nbytes, o) for t, o in layout.tensors)
    return [(0, len(layout.header)), *pieces]


def open_segment(path: str, flags: int) -> int:
    """The segment file at ``path`` opened (never through a link), if it is a regular
    file of ours that no one else may write; else ``PermissionDenied``."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not mode & 0o022:
        return fd
    os.close(fd)
    raise PermissionDenied(
        f"the memory tier's segment is not a file of ours alone (uid {st.st_uid}, mode "
        f"{mode:o}): the agent's directory is not its own",
        path,
    )


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
        fd = open_segment(path, os.O_RDWR)
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


def load(
    path: str,
    sums: Sums,
    state_dict: dict[str, Any],
    check: Callable[[Any], None] | None = None,
) -> None:
    """Load the segment at ``path`` into ``state_dict`` in place (as ``dcp.load`` does),
    each range read checked against ``sums`` (``IntegrityError``: it differs). ``check``
    is given what the segment holds first (each tensor an empty one on the ``meta``
    device) and may refuse it, before any byte is read."""
    expected = _expected(sums)
    fd = open_segment(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(READERS, "graben-segment") as pool:
            skeleton, start = _skeleton(fd, expected, path)
            if check is not None:
                check(_value(skeleton, _meta_tensor))
            segment = _Reader(fd, start, pool, expected, path)
            _restore(segment, skeleton, state_dict, "")
            for read in segment.reads:
                read.result()
            for then in segment.after:
                then()
    finally:
        os.close(fd)


def views_of(memory: mmap.mmap, layout: Layout) -> Any:
    """A mapped segment, written by this process from ``layout``, as a state dict whose
    tensors are views of its memory."""
    start = _aligned(len(layout.header))

    def view(slot: _Slot) -> torch.Tensor:
        dtype = _dtype(slot.dtype)
        count = _numel(slot.shape)
        if count == 0:
            return torch.empty(slot.shape, dtype=dtype)
        flat = torch.frombuffer(memory, dtype=dtype, count=count, offset=start + slot.offset)
        return flat.view(slot.shape)

    return _value(layout.skeleton, view)


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


def _node(value: Any, slot: Callable[[torch.Tensor], _Slot], where: str) -> Node:
    """``value`` as a skeleton: each tensor replaced by ``slot(tensor)``, each Stateful by
    its state; ``Unholdable`` for any value but those the module docstring names."""
    if isinstance(value, torch.Tensor):
        return slot(value)
    if isinstance(value, dict):
        for key in value:
            if type(key) not in _PLAIN:
                raise Unholdable(f"the memory tier keeps no {type(key).__name__} key at {where}/")
        return _Dict([(k, _node(v, slot, f"{where}/{k}")) for k, v in value.items()])
    if isinstance(value, list | tuple):
        items = [_node(v, slot, f"{where}/{i}") for i, v in enumerate(value)]
        return _List(items) if isinstance(value, list) else _Tuple(items)
    if _is_stateful(value):
        return _Stateful(_node(value.state_dict(), slot, where))
    if type(value) is bytes:
        return _Bytes(value)
    if type(value) not in _PLAIN:
        raise Unholdable(
            f"the memory tier keeps no {type(value).__name__} (at {where or '/'}): plain "
            "values, tensors and containers of them only"
        )
    return _Value(value)


def _value(node: Node, make: Callable[[_Slot], Any]) -> Any:
    """The value ``node`` stands for, each slot made a tensor by ``make``."""
    if isinstance(node, _Slot):
        return make(node)
    if isinstance(node, _Stateful):
        return _value(node.state, make)
    if isinstance(node, _Dict):
        return {k: _value(v, make) for k, v in node.items}
    if isinstance(node, _List):
        return [_value(v, make) for v in node.items]
    if isinstance(node, _Tuple):
        return tuple(_value(v, make) for v in node.items)
    return node.value


def _slots(node: Node) -> Iterator[_Slot]:
    if isinstance(node, _Slot):
        yield node
    elif isinstance(node, _Stateful):
        yield from _slots(node.state)
    elif isinstance(node, _Dict):
        for _, item in node.items:
            yield from _slots(item)
    elif isinstance(node, _List | _Tuple):
        for item in node.items:
            yield from _slots(item)


@dataclass(slots=True)
class _Reader:
    """An open segment being read into a state dict: where its data starts, the reads
    under way, each checked as it lands, and what waits for them (copies into tensors of
    another type, and each ``Stateful``'s ``load_state_dict``)."""

    fd: int
    start: int
    pool: ThreadPoolExecutor
    expected: dict[tuple[int, int], bytes]
    """The agent's blake3 of each range, by ``(offset, length)``."""
    path: str
    reads: list[Future[None]] = field(default_factory=list)
    after: list[Callable[[], object]] = field(default_factory=list)


def _restore(segment: _Reader, saved: Node, target: Any, where: str) -> Any:
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
    if isinstance(saved, _Dict) and isinstance(target, dict):
        items = dict(saved.items)
        missing = set(target) - set(items)
        if missing:
            raise InvalidArgument(
                f"the memory tier's step lacks {sorted(map(str, missing))[:3]} under {where or '/'}"
            )
        for key in target:
            target[key] = _restore(segment, items[key], target[key], f"{where}/{key}")
        return target
    if isinstance(saved, _List) and isinstance(target, list) and len(saved.items) == len(target):
        for i, item in enumerate(saved.items):
            target[i] = _restore(segment, item, target[i], f"{where}/{i}")
        return target
    if isinstance(saved, _Tuple) and isinstance(target, tuple) and len(saved.items) == len(target):
        pairs = enumerate(zip(saved.items, target, strict=True))
        return tuple(_restore(segment, s, t, f"{where}/{i}") for i, (s, t) in pairs)
    if any(True for _ in _slots(saved)):
        raise InvalidArgument(f"the memory tier holds tensors at {where or '/'}; not here")
    return _value(saved, lambda slot: None)


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
    for at in range(0, view.nbytes, PIECE):  # read by several threads: one is ~half
        piece = view[at : at + PIECE]  # the speed of memory here
        offset = segment.start + slot.offset + at
        blake = segment.expected.get((offset, piece.nbytes))
        if blake is None:
            raise IntegrityError(_CHANGED.format(part=f"ranges at {where}"), segment.path)
        read = segment.pool.submit(_read_into, segment, piece, offset, blake, where)
        segment.reads.append(read)
    if not direct:
        segment.after.append(partial(target.detach().copy_, into))


def _read_into(segment: _Reader, view: memoryview, offset: int, blake: bytes, where: str) -> None:
    """Read ``view`` from ``offset``; ``IntegrityError`` unless it hashes to ``blake``
    (hashed a ``HASH_STRIDE`` at a time, each while still in the core's cache)."""
    done, hasher = 0, blake3.blake3()
    while done < view.nbytes:
        n = os.preadv(segment.fd, [view[done : done + HASH_STRIDE]], offset + done)
        if n <= 0:
            raise IntegrityError(f"the memory tier's segment ends early at {where}", segment.path)
        hasher.update(view[done : done + n])
        done += n
    if not hmac.compare_digest(hasher.digest(), blake):
        raise IntegrityError(_CHANGED.format(part=f"bytes at {where}"), segment.path)


def _pieces(tensors: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Each tensor, given as ``(nbytes, offset)``, cut into pieces: ``(offset, length)``."""
    for nbytes, offset in tensors:
        for at in range(0, nbytes, PIECE):
            yield offset + at, min(PIECE, nbytes - at)


_CHANGED = (
    "the memory tier's segment does not hold what its writer wrote (its {part} differ from "
    "what the agent hashed when it was done): refused"
)


def _skeleton(fd: int, expected: dict[tuple[int, int], bytes], path: str) -> tuple[Node, int]:
    """The segment's skeleton, once its header is checked against ``expected``, and where
    its data starts."""
    size = os.fstat(fd).st_size
    prefix = os.pread(fd, _LENGTH.size, 0)
    (length,) = _LENGTH.unpack(prefix) if len(prefix) == _LENGTH.size else (-1,)
    if not 0 <= length <= min(MAX_HEADER, size - _LENGTH.size):
        raise IntegrityError(_CHANGED.format(part="header's length"), path)
    header = prefix + os.pread(fd, length, _LENGTH.size)
    blake = expected.get((0, len(header)), b"")
    if not hmac.compare_digest(blake3.blake3(header).digest(), blake):
        raise IntegrityError(_CHANGED.format(part="header's bytes"), path)
    try:
        skeleton: Node = _HEADER.decode(header[_LENGTH.size :])
    except msgspec.DecodeError as exc:  # what the agent hashed: its writer's bug, no attacker
        raise IntegrityError(
            f"the memory tier's segment has a header unread ({exc})", path
        ) from None
    return skeleton, _aligned(_LENGTH.size + length)


def _is_stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


def _meta_tensor(slot: _Slot) -> torch.Tensor:
    return torch.empty(slot.shape, dtype=_dtype(slot.dtype), device="meta")


def _expected(sums: Sums) -> dict[tuple[int, int], bytes]:
    """The agent's blake3 of each range, by ``(offset, length)``."""
    return {(offset, length): blake for offset, length, blake in sums}


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
