"""The wire: length-prefixed binary frames over TCP, shared by servers and clients.

A frame is a 16-byte prefix, a msgpack header and a raw payload::

    b"GRB1" | header length (u32 LE) | payload length (u64 LE) | header | payload

The header is a ``Call`` (client to server) or a ``Reply``; its ``body`` is the
operation's own msgpack, decoded by whoever knows the operation's type. The
payload carries chunk bytes and is received straight into the buffer its
receiver names (``Sink``): a data node's pooled buffer, or the reader's own
memory on a client. Small frames go through one receive buffer, so a stream
of small requests costs one ``recv`` for many frames. A payload may also be
sent from an open file by ``sendfile`` (``send_file``: a data node's chunk
reads), the kernel moving page-cache pages to the socket.

Anything that is not a frame (bad magic, a header or payload over its limit,
a header that does not decode) is a ``ProtocolError``: the connection is
dropped and nothing else is affected. A sink may refuse a payload before any
memory is spent on it (a ``GrabenError``: the payload is read and dropped,
and ``on_refused`` answers), or defer it (``None``: reading pauses until
``retry``), which is how a server bounds what its peers make it hold.

A body too large for a header (a commit of many chunks, a page of long paths) travels
as the frame's payload instead, flagged ``bulk``. Measured on loopback here
(docs/architecture.md, "Wire"): ``recv_into`` a preallocated buffer 5.3 GB/s, asyncio 1.4.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from typing import Any, Final, NamedTuple, cast

import msgspec

from .._errors import GrabenError, InvalidArgument, ProtocolError, TLSError, error_from_code
from ._budget import MemoryBudget
from ._tls import ALERT, looks_like_tls

log = logging.getLogger("graben.wire")

MAGIC: Final = b"GRB1"
PREFIX: Final = struct.Struct("<4sIQ")
MAX_HEADER: Final = 1 << 20
MAX_PAYLOAD: Final = 512 << 20
INBOX: Final = 256 << 10
"""Receive buffer for prefixes, headers and payloads smaller than it (a client's)."""
SERVER_INBOX: Final = 64 << 10
"""A server's receive buffer per connection: idle connections cost little; a
header larger than it grows the buffer against the server's memory budget."""
INLINE_BODY_MAX: Final = 64 << 10
"""Bodies larger than this travel as a bulk payload, not in the header."""
TLS_SLICE: Final = 256 << 10
"""Bytes of a payload handed to a TLS transport at once (see ``_send_sliced``)."""

NIL: Final = msgspec.Raw(b"\xc0")  # msgpack nil


class WireError(msgspec.Struct, frozen=True):
    """A ``GrabenError`` as it crosses the wire (see ``_errors.ERRORS``)."""

    code: str
    message: str
    path: str | None = None


class Call(msgspec.Struct, frozen=True, tag="call"):
    """A request: ``op`` names the handler, ``body`` is its msgpack arguments."""

    id: int
    op: str
    body: msgspec.Raw = NIL
    token: str = ""
    bulk: bool = False
    """The body is the payload (too large for a header)."""


class Reply(msgspec.Struct, frozen=True, tag="reply"):
    """The answer to the ``Call`` with the same ``id``: a body or an error."""

    id: int
    body: msgspec.Raw = NIL
    error: WireError | None = None
    bulk: bool = False
    """The body is the payload (too large for a header)."""


Header = Call | Reply
Sink = Callable[[Header, int], memoryview | None]
"""Where a frame's payload of ``n`` bytes goes: exactly ``n`` bytes, or ``None``
to wait (the sink arranges a ``retry``); raising a ``GrabenError`` refuses it."""
OnFrame = Callable[[Header, memoryview | None], None]
"""Called with each whole frame; the payload view is the one ``Sink`` returned."""
OnRefused = Callable[[Header, GrabenError], None]
"""Called once a refused payload has been read past."""

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Header)
_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}  # by type: ``decode`` explains


class FileSpan(NamedTuple):
    """Bytes of an open file to send as a frame's payload (``FrameProtocol.send_file``)."""

    fd: int
    offset: int
    length: int


def encode(value: Any) -> msgspec.Raw:
    """A value as a msgpack body; ``InvalidArgument`` if it cannot be sent."""
    try:
        return msgspec.Raw(_encoder.encode(value))
    except (UnicodeEncodeError, TypeError, OverflowError) as exc:
        raise InvalidArgument(f"cannot send {type(value).__name__}: {exc}") from None


def decode(body: msgspec.Raw, kind: type[Any]) -> Any:
    """A msgpack body as ``kind``; a ``ProtocolError`` if it is not one. A decoder is kept
    per type: ``msgpack.decode(body, type=kind)`` works the type out on every call (19 µs
    for the metadata service's union of 39 requests, 1 µs here)."""
    if (decoder := _decoders.get(kind)) is None:
        decoder = _decoders[kind] = msgspec.msgpack.Decoder(kind)  # types: a few dozen
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"malformed request body: {exc}") from None
    except (msgspec.DecodeError, RecursionError) as exc:
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
        *,
        inbox: int = INBOX,
        budget: MemoryBudget | None = None,
        on_refused: OnRefused | None = None,
        on_made: Callable[[], None] | None = None,
        on_fill: Callable[[Header, int], None] | None = None,
    ) -> None:
        self._sink, self._on_frame, self._on_lost = sink, on_frame, on_lost
        self._on_fill = on_fill  # told how much of a payload has landed in place, as it lands
        self._on_refused, self._on_made = on_refused, on_made
        self._max_payload = max_payload
        self._base, self._budget = inbox, budget
        self._inbox = bytearray(inbox)
        self._view = memoryview(self._inbox)
        self._start = self._end = 0  # unparsed bytes are _inbox[_start:_end]
        self._target: memoryview | None = None  # a payload being received in place
        self._target_fill = 0
        self._pending: tuple[Header, memoryview] | None = None
        self._waiting: tuple[Header, int] | None = None  # a header whose payload awaits a sink
        self._skip = 0  # bytes of a refused payload still to read past
        self._refused: tuple[Header, GrabenError] | None = None
        self._stalled = False  # reading paused until ``retry``
        self.transport: asyncio.Transport | None = None
        self._tls = False  # the transport encrypts (asyncio's TLS)
        self._sending = asyncio.Lock()  # over TLS, a frame goes in slices: one at a time
        self._writable = asyncio.Event()
        self._writable.set()
        self.broken: BaseException | None = None
        self.last_active = time.monotonic()
        """When bytes last arrived (servers drop connections idle too long)."""
        self.grown_since: float | None = None
        """Since when the inbox holds more than its base size (a large header)."""

    # -- asyncio callbacks -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports quack like asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        # Pause as soon as anything is left unsent, so ``send`` returns only
        # once the kernel has the bytes: callers may then reuse payload buffers
        # (a transport may keep a reference instead of a copy). Over TLS, once
        # bytes are encrypted the transport holds its own copy, so only bytes
        # not yet encrypted count; and asyncio's TLS transport pauses at
        # ``>= high``, not ``> high``: high=0 would pause it after every write.
        self._tls = transport.get_extra_info("ssl_object") is not None
        self.transport.set_write_buffer_limits(high=1 if self._tls else 0)
        if self._on_made is not None:
            self._on_made()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None:
            return self._target[self._target_fill :]
        if self._end == len(self._inbox):
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        try:
            if self._target is not None:
                self._target_fill += nbytes
                if self._on_fill is not None and self._pending is not None:
                    self._on_fill(self._pending[0], self._target_fill)
                if self._target_fill == self._target.nbytes:
                    self._finish_payload()
            else:
                self._end += nbytes
            self._parse()
        except (ProtocolError, TLSError) as exc:
            self.fail(exc)
        except Exception as exc:  # a bug must cost this connection only, never the server
            log.exception("dropping a connection after an internal error")
            self.fail(ProtocolError(f"internal error: {exc!r}"))

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()  # wake writers so they see the loss
        if self.broken is None:
            self.broken = exc or ConnectionResetError("connection closed")
        self._shrink()
        if self._on_lost is not None:
            self._on_lost(self.broken)

    def retry(self) -> None:
        """Go on reading after a sink or the budget asked to wait."""
        if not self._stalled or self.broken is not None or self.transport is None:
            return
        self._stalled = False
        self.transport.resume_reading()
        try:
            self._parse()
        except ProtocolError as exc:
            self.fail(exc)

    def _stall(self) -> None:
        self._stalled = True
        if self.transport is not None:
            self.transport.pause_reading()

    # -- parsing ------------------------------------------------------------

    def _compact(self) -> None:
        live = self._end - self._start
        self._view[:live] = self._view[self._start : self._end]
        self._start, self._end = 0, live

    def _parse(self) -> None:
        while self._target is None and self.broken is None and not self._stalled:
            if self._skip or self._refused is not None:
                if not self._read_past_refused():
                    return
                continue
            if self._waiting is not None:
                header, length = self._waiting
                self._waiting = None
                self._take_payload(header, length)
                continue
            if not self._parse_header():
                return

    def _parse_header(self) -> bool:
        """Parse one frame's prefix and header if they are all here; whether one was."""
        if looks_like_tls(self._inbox, self._start, self._end):  # two bytes tell (an alert is 7)
            self._end_tls(self._inbox[self._start])
            return False
        if self._end - self._start < PREFIX.size:
            self._shrink()
            return False
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
                self._grow(PREFIX.size + header_length)
            return False
        header = self._decode(self._view[frame_start : frame_start + header_length])
        self._start = frame_start + header_length
        self._take_payload(header, payload_length)
        return True

    def _end_tls(self, record: int) -> None:
        """The peer speaks TLS and we do not. A client's hello gets TLS's own refusal
        (``ALERT``), so the client can say what went wrong instead of retrying a lost
        connection; an alert means a TLS server refused us."""
        if record != 0x16 or self.transport is None:
            raise TLSError("the peer answered in TLS")
        peer = self.transport.get_extra_info("peername") or ("?", "?")
        # The CLI's logging keeps a flood of these to one line per interval.
        log.warning("refused %s:%s: a TLS client dialled this plaintext server", *peer[:2])
        self.broken = TLSError("a TLS client dialled this plaintext server")
        self.transport.write(ALERT)
        self.transport.close()  # not abort(): the alert goes out first

    def _grow(self, need: int) -> None:
        """Make the inbox hold ``need`` bytes (a large header), charged to the budget."""
        if need <= len(self._inbox):
            return
        if self._budget is not None and not self._budget.take(need - len(self._inbox), self.retry):
            self._stall()
            return
        bigger = bytearray(need)
        bigger[: self._end - self._start] = self._view[self._start : self._end]
        self._end -= self._start
        self._start = 0
        self._view.release()
        self._inbox, self._view = bigger, memoryview(bigger)
        if self.grown_since is None:
            self.grown_since = time.monotonic()

    def _shrink(self) -> None:
        """Back to the base inbox once a large header is parsed (and its bytes given back)."""
        if self.grown_since is None or self._end - self._start > self._base:
            return
        extra = len(self._inbox) - self._base
        smaller = bytearray(self._base)
        live = self._end - self._start
        smaller[:live] = self._view[self._start : self._end]
        self._view.release()
        self._inbox, self._view = smaller, memoryview(smaller)
        self._start, self._end = 0, live
        self.grown_since = None
        if self._budget is not None:
            self._budget.give(extra)

    @staticmethod
    def _decode(raw: memoryview) -> Header:
        # From a copy: a decoded ``Raw`` body points into the bytes it came
        # from, and the inbox is reused for the next frames.
        try:
            header: Header = _decoder.decode(bytes(raw))
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            raise ProtocolError(f"undecodable frame header: {exc}") from None
        return header

    def _take_payload(self, header: Header, length: int) -> None:
        if length == 0:
            self._on_frame(header, None)
            return
        try:
            target = self._sink(header, length)
        except ProtocolError:
            raise
        except GrabenError as exc:  # refused before a byte of memory went to it
            if self._on_refused is None:
                raise ProtocolError(exc.message) from None
            self._skip, self._refused = length, (header, exc)
            return
        if target is None:
            self._waiting = (header, length)
            self._stall()
            return
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

    def _read_past_refused(self) -> bool:
        """Drop a refused payload's bytes as they come; whether it is all gone."""
        dropped = min(self._skip, self._end - self._start)
        self._start += dropped
        self._skip -= dropped
        if self._start == self._end:
            self._start = self._end = 0
        if self._skip:
            return False
        assert self._refused is not None
        assert self._on_refused is not None
        (header, exc), self._refused = self._refused, None
        self._on_refused(header, exc)
        return True

    def _finish_payload(self) -> None:
        assert self._pending is not None
        header, target = self._pending
        self._target, self._pending = None, None
        self._on_frame(header, target)

    # -- sending ------------------------------------------------------------

    async def send(self, header: Header, payload: memoryview | None = None) -> None:
        """Send one frame; waits while the peer is slow (flow control)."""
        if self._tls or self._sending.locked():  # a frame is going out in parts: queue
            async with self._sending:
                await self._send_whole(header, payload)
            return
        await self._send_whole(header, payload)

    async def _send_whole(self, header: Header, payload: memoryview | None) -> None:
        if self.broken is not None or self.transport is None:
            raise ConnectionResetError("connection closed")
        size = 0 if payload is None else payload.nbytes
        if self._tls:
            await self._send_sliced(frame_prefix(header, size), payload)
            return
        self.transport.write(frame_prefix(header, size))
        if payload is not None and size:
            self.transport.write(payload)
        await self._writable.wait()
        if self.broken is not None:
            raise ConnectionResetError("connection closed")

    async def _send_sliced(self, prefix: bytes, payload: memoryview | None) -> None:
        """A frame to a TLS transport, its payload a slice at a time, each once the last
        has left the TLS layer (callers hold ``_sending``: another frame must not come
        between two slices). Whole, an 8 MiB chunk is encrypted into a fresh 8 MiB
        buffer, copied again into the socket's and sent from there: measured on
        loopback here, slices read chunks twice as fast (1.0 against 0.5 GB/s)."""
        parts = [memoryview(prefix)]
        if payload is not None:
            parts += [payload[i : i + TLS_SLICE] for i in range(0, payload.nbytes, TLS_SLICE)]
        for sent, part in enumerate(parts):
            if self.broken is not None or self.transport is None:
                raise ConnectionResetError("connection closed")
            self.transport.write(part)
            try:
                await self._writable.wait()
            except BaseException:  # cancelled: the peer would read the next frame as this one's
                if sent + 1 < len(parts):
                    self.fail(ConnectionResetError("a frame was cut short"))
                raise
        if self.broken is not None:
            raise ConnectionResetError("connection closed")

    async def send_file(self, header: Header, span: FileSpan) -> None:
        """Send one frame whose payload is ``span`` of an open file, by ``sendfile(2)``:
        the kernel moves page-cache pages to the socket, no copy through Python (a data
        node's warm chunk reads; plaintext only, TLS must encrypt in user space)."""
        if self.broken is not None or self.transport is None:
            raise ConnectionResetError("connection closed")
        if self._tls:
            raise InvalidArgument("sendfile over TLS")
        loop = asyncio.get_running_loop()
        async with self._sending:  # nothing may come between the prefix and the file's bytes
            self.transport.write(frame_prefix(header, span.length))
            try:
                with open(span.fd, "rb", buffering=0, closefd=False) as file:
                    # asyncio waits for the prefix to leave, pauses reading while the
                    # kernel sends, then resumes it.
                    await loop.sendfile(self.transport, file, span.offset, span.length)
            except (OSError, RuntimeError) as exc:  # RuntimeError: the transport is closing
                self.fail(ConnectionResetError(f"sendfile failed: {exc}"))
                raise ConnectionResetError(f"sendfile failed: {exc}") from None
            except BaseException:  # cut short: the peer would read the next frame as this one's
                self.fail(ConnectionResetError("a frame was cut short"))
                raise
            finally:
                if self._stalled and self.transport is not None:
                    self.transport.pause_reading()  # asyncio resumed what a sink had paused
        if self.broken is not None:
            raise ConnectionResetError("connection closed")

    def fail(self, exc: BaseException) -> None:
        """Drop the connection because of ``exc`` (kept in ``broken``)."""
        if self.broken is None:
            self.broken = exc
        if self.transport is not None:
            self.transport.abort()
