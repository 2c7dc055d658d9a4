"""The wire: length-prefixed binary frames over TCP, shared by servers and clients.

A frame is a 16-byte prefix, a msgpack header and a raw payload::

    b"GRB1" | header length (u32 LE) | payload length (u64 LE) | header | payload

The header is a ``Call`` (client to server) or a ``Reply``; its ``body`` is the
operation's own msgpack, decoded by whoever knows the operation's type. The
payload carries chunk bytes and is received straight into the buffer its
receiver names (``Sink``): a data node's pooled buffer, or the reader's own
memory on a client. Small frames go through one receive buffer, so a stream
of small requests costs one ``recv`` for many frames.

Anything that is not a frame (bad magic, a header or payload over its limit,
a header that does not decode) is a ``ProtocolError``: the connection is
dropped and nothing else is affected. Measured on loopback here (DESIGN.md
"Wire"): ``recv_into`` a preallocated buffer 5.3 GB/s, asyncio streams 1.4.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any, Final, cast

import msgspec

from ._errors import GrabenError, InvalidArgument, ProtocolError, error_from_code
from ._types import WireError

MAGIC: Final = b"GRB1"
PREFIX: Final = struct.Struct("<4sIQ")
MAX_HEADER: Final = 1 << 20
MAX_PAYLOAD: Final = 512 << 20
INBOX: Final = 256 << 10
"""Receive buffer for prefixes, headers and payloads smaller than it."""

NIL: Final = msgspec.Raw(b"\xc0")  # msgpack nil


class Call(msgspec.Struct, frozen=True, tag="call"):
    """A request: ``op`` names the handler, ``body`` is its msgpack arguments."""

    id: int
    op: str
    body: msgspec.Raw = NIL
    token: str = ""


class Reply(msgspec.Struct, frozen=True, tag="reply"):
    """The answer to the ``Call`` with the same ``id``: a body or an error."""

    id: int
    body: msgspec.Raw = NIL
    error: WireError | None = None


Header = Call | Reply
Sink = Callable[[Header, int], memoryview]
"""Where a frame's payload of ``n`` bytes goes; must return exactly ``n`` bytes."""
OnFrame = Callable[[Header, memoryview | None], None]
"""Called with each whole frame; the payload view is the one ``Sink`` returned."""

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Header)


def encode(value: Any) -> msgspec.Raw:
    """A value as a msgpack body; ``InvalidArgument`` if it cannot be sent."""
    try:
        return msgspec.Raw(_encoder.encode(value))
    except (UnicodeEncodeError, TypeError, OverflowError) as exc:
        raise InvalidArgument(f"cannot send {type(value).__name__}: {exc}") from None


def decode(body: msgspec.Raw, kind: type[Any]) -> Any:
    """A msgpack body as ``kind``; a ``ProtocolError`` if it is not one."""
    try:
        return msgspec.msgpack.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"malformed request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"undecodable request body: {exc}") from None


def to_wire(exc: GrabenError) -> WireError:
    """The wire form of an error."""
    return WireError(exc.code, exc.message, exc.path)


def from_wire(error: WireError) -> GrabenError:
    """The error a peer raised, rebuilt as the same class."""
    return error_from_code(error.code, error.message, error.path)


def frame_prefix(header: Header, payload_length: int) -> bytes:
    """Prefix and header bytes of a frame; the payload follows separately."""
    encoded = _encoder.encode(header)
    if len(encoded) > MAX_HEADER:
        raise ProtocolError(f"header of {len(encoded)} bytes is over the {MAX_HEADER} limit")
    return PREFIX.pack(MAGIC, len(encoded), payload_length) + encoded


class FrameProtocol(asyncio.BufferedProtocol):
    """Parses frames from a stream; small parts via an inbox, payloads in place.

    Subclasses (or owners) supply ``sink`` and ``on_frame`` and handle
    ``connection_lost``. Sending is ``send(header, payload)``.
    """

    def __init__(
        self,
        sink: Sink,
        on_frame: OnFrame,
        on_lost: Callable[[BaseException], None] | None = None,
        max_payload: int = MAX_PAYLOAD,
    ) -> None:
        self._sink, self._on_frame, self._on_lost = sink, on_frame, on_lost
        self._max_payload = max_payload
        self._inbox = bytearray(INBOX)
        self._view = memoryview(self._inbox)
        self._start = self._end = 0  # unparsed bytes are _inbox[_start:_end]
        self._target: memoryview | None = None  # a payload being received in place
        self._target_fill = 0
        self._pending: tuple[Header, memoryview] | None = None
        self.transport: asyncio.Transport | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self.broken: BaseException | None = None

    # -- asyncio callbacks -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports quack like asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        # Pause as soon as anything is left unsent, so ``send`` returns only
        # once the kernel has the bytes: callers may then reuse payload buffers
        # (a transport may keep a reference instead of a copy).
        self.transport.set_write_buffer_limits(high=0)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None:
            return self._target[self._target_fill :]
        if self._end == len(self._inbox):
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._target is not None:
                self._target_fill += nbytes
                if self._target_fill == self._target.nbytes:
                    self._finish_payload()
            else:
                self._end += nbytes
            self._parse()
        except ProtocolError as exc:
            self.fail(exc)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()  # wake writers so they see the loss
        if self.broken is None:
            self.broken = exc or ConnectionResetError("connection closed")
        if self._on_lost is not None:
            self._on_lost(self.broken)

    # -- parsing ------------------------------------------------------------

    def _compact(self) -> None:
        live = self._end - self._start
        self._view[:live] = self._view[self._start : self._end]
        self._start, self._end = 0, live

    def _parse(self) -> None:
        while self._target is None and self.broken is None:
            if self._end - self._start < PREFIX.size:
                return
            magic, header_length, payload_length = PREFIX.unpack_from(self._inbox, self._start)
            if magic != MAGIC:
                raise ProtocolError("not a graben frame (bad magic): is this a graben server?")
            if header_length > MAX_HEADER or payload_length > self._max_payload:
                raise ProtocolError(
                    f"frame over the limits (header {header_length}, payload {payload_length})"
                )
            frame_start = self._start + PREFIX.size
            if self._end - frame_start < header_length:
                if PREFIX.size + header_length > len(self._inbox) - self._start:
                    self._compact()
                return
            header = self._decode(self._view[frame_start : frame_start + header_length])
            self._start = frame_start + header_length
            self._take_payload(header, payload_length)

    @staticmethod
    def _decode(raw: memoryview) -> Header:
        # From a copy: a decoded ``Raw`` body points into the bytes it came
        # from, and the inbox is reused for the next frames.
        try:
            header: Header = _decoder.decode(bytes(raw))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ProtocolError(f"undecodable frame header: {exc}") from None
        return header

    def _take_payload(self, header: Header, length: int) -> None:
        if length == 0:
            self._on_frame(header, None)
            return
        target = self._sink(header, length)
        if target.nbytes != length:
            raise ProtocolError(f"sink gave {target.nbytes} bytes for a {length}-byte payload")
        have = min(length, self._end - self._start)
        target[:have] = self._view[self._start : self._start + have]
        self._start += have
        if have == length:
            self._on_frame(header, target)
            return
        self._target, self._target_fill, self._pending = target, have, (header, target)
        self._start = self._end = 0  # the inbox is empty; the rest lands in place

    def _finish_payload(self) -> None:
        assert self._pending is not None
        header, target = self._pending
        self._target, self._pending = None, None
        self._on_frame(header, target)

    # -- sending ------------------------------------------------------------

    async def send(self, header: Header, payload: memoryview | None = None) -> None:
        """Send one frame; waits while the peer is slow (flow control)."""
        if self.broken is not None or self.transport is None:
            raise ConnectionResetError("connection closed")
        size = 0 if payload is None else payload.nbytes
        self.transport.write(frame_prefix(header, size))
        if payload is not None and size:
            self.transport.write(payload)
        await self._writable.wait()
        if self.broken is not None:
            raise ConnectionResetError("connection closed")

    def fail(self, exc: BaseException) -> None:
        """Drop the connection because of ``exc`` (kept in ``broken``)."""
        if self.broken is None:
            self.broken = exc
        if self.transport is not None:
            self.transport.abort()
