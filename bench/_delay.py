"""A TCP proxy that adds latency: what ``tc netem`` would do, where the kernel has none.

``delaying_proxy(host, port, delay_s)`` listens on 127.0.0.1 (a free port)
and forwards every connection it accepts to ``host:port``, holding each
chunk of bytes ``delay_s / 2`` in each direction, so that every round trip
through it costs ``delay_s`` more. It delays without limiting bandwidth:
each chunk is stamped when it arrives and one writer per direction sends it
when its stamp plus the delay has passed, while the reader goes on taking
the next ones (bytes in order, at most ``QUEUED`` chunks held per
direction). Both sockets of a pair have ``TCP_NODELAY``. An end of file is
passed on like the bytes before it (delayed, in order), so a side that
half-closes still gets its replies; once both directions have ended, both
sockets are closed. A reset or failure on either side cuts both at once.
Its timers wake a little late (~0.1 ms here), never early: what it adds is
at least ``delay_s``.

It runs in a process of its own (``python -m graben.bench._delay HOST PORT
DELAY_S``), not in a thread of the caller's: the bench's clients keep the
caller's interpreter busy, and a thread waiting for its GIL would add
milliseconds of its own, unevenly. The process prints its port, then serves
until its standard input closes: leaving the block closes it (and its
parent dying does too), and the process cuts every connection and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator

HOST = "127.0.0.1"
READ_BYTES = 256 * 1024
"""The most one read takes from a socket."""
QUEUED = 1024
"""Chunks held per direction before the proxy stops reading that side (TCP pushes back)."""
STOP_S = 10.0
"""How long leaving the block waits for the process to exit before killing it."""

Chunk = tuple[float, bytes | None]
"""When a chunk is due, and its bytes (``None``: nothing more comes this way)."""


@contextlib.contextmanager
def delaying_proxy(target_host: str, target_port: int, delay_s: float) -> Iterator[tuple[str, int]]:
    """A proxy to ``target_host:target_port`` adding ``delay_s`` to every round trip,
    for the block; yields the ``(host, port)`` to connect to instead. Leaving the block
    closes every connection through it and stops it."""
    if not delay_s >= 0:
        raise ValueError(f"delay_s must be a non-negative number of seconds, not {delay_s}")
    argv = (target_host, str(target_port), repr(delay_s))
    proc = subprocess.Popen(
        [sys.executable, "-m", __name__, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # Ctrl-C reaches the caller, who stops it in order
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.isdigit():
            raise RuntimeError(f"the delaying proxy did not start (exit code {proc.poll()})")
        yield HOST, int(line)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[str]) -> None:
    """Close the process's stdin (its signal to stop), wait for it, kill it if it hangs."""
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    try:
        proc.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class DelayingProxy:
    """The proxy on the running event loop: ``start``, then ``close``."""

    def __init__(self, target_host: str, target_port: int, delay_s: float) -> None:
        self._target = (target_host, target_port)
        self._half = delay_s / 2
        self._server: asyncio.Server | None = None
        self._pairs: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen on ``HOST``, any free port; the port."""
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        """Stop listening and cut every connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._pairs):
            task.cancel()
        await asyncio.gather(*self._pairs, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pairs.add(task)
        try:
            await self._connect(client_r, client_w)
        except asyncio.CancelledError:
            # Only close() cancels it, and it has ended: asyncio 3.11 would report a handler
            # that ends cancelled as an error ("Exception in callback").
            pass
        finally:
            self._pairs.discard(task)

    async def _connect(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        writers = [client_w]
        clean = False
        try:
            # Nothing listening behind: the client sees its connection closed, as it would.
            with contextlib.suppress(OSError):
                server_r, server_w = await asyncio.open_connection(*self._target)
                writers.append(server_w)
                for writer in writers:
                    _nodelay(writer)
                clean = await _relay((client_r, server_w), (server_r, client_w), self._half)
        finally:
            if not clean:  # a reset, a failure, the proxy stopping (cancelled): cut at once
                for writer in writers:
                    writer.transport.abort()
        await _close(writers)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    """Send each write at once: the delay is the proxy's to add, not Nagle's."""
    writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


Pipe = tuple[asyncio.StreamReader, asyncio.StreamWriter]
"""One direction of a connection: where bytes come from, where they go."""


async def _relay(up: Pipe, down: Pipe, delay_s: float) -> bool:
    """Both directions of one connection until both have ended; whether both ended
    cleanly (with an end of file, not a reset)."""
    queues = [asyncio.Queue[Chunk](QUEUED), asyncio.Queue[Chunk](QUEUED)]
    ways = list(zip((up, down), queues, strict=True))
    tasks = [asyncio.create_task(_take(r, q, delay_s)) for (r, _), q in ways]
    tasks += [asyncio.create_task(_give(q, w)) for (_, w), q in ways]
    try:
        pending: set[asyncio.Task[None]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(task.exception() is not None for task in done):
                return False
        return True
    finally:
        for task in tasks:
            task.cancel()
        # Their errors (a reset peer) are the ordinary end of a connection: retrieved, dropped.
        await asyncio.gather(*tasks, return_exceptions=True)


async def _take(reader: asyncio.StreamReader, queue: asyncio.Queue[Chunk], delay_s: float) -> None:
    """Read chunks as they arrive, each stamped with when it is due; then the end of
    file, delayed like the bytes before it."""
    loop = asyncio.get_running_loop()
    while data := await reader.read(READ_BYTES):
        await queue.put((loop.time() + delay_s, data))
    await queue.put((loop.time() + delay_s, None))


async def _give(queue: asyncio.Queue[Chunk], writer: asyncio.StreamWriter) -> None:
    """Write each chunk once it is due, in order; at the end of file, pass it on."""
    loop = asyncio.get_running_loop()
    while True:
        due, data = await queue.get()
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        if data is None:
            writer.write_eof()  # half-closed, as the sender left it: replies still come back
            return
        writer.write(data)
        await writer.drain()


async def _close(writers: list[asyncio.StreamWriter]) -> None:
    """Close both sides once what they were sent is flushed; a peer already gone is fine."""
    for writer in writers:
        writer.close()
    for writer in writers:
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _serve(target_host: str, target_port: int, delay_s: float) -> None:
    """Print the port, serve until stdin closes, then stop."""
    proxy = DelayingProxy(target_host, target_port, delay_s)
    print(await proxy.start(), flush=True)
    try:
        await _stdin_closed()
    finally:
        await proxy.close()


async def _stdin_closed() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()  # nothing is sent: this returns at end of file


def main(argv: list[str] | None = None) -> None:
    """``python -m graben.bench._delay TARGET_HOST TARGET_PORT DELAY_S``."""
    host, port, delay = argv if argv is not None else sys.argv[1:]
    asyncio.run(_serve(host, int(port), float(delay)))


if __name__ == "__main__":
    main()
