"""The daemon's wait for the FUSE device (``Readable``), on a real pipe and loop."""

from __future__ import annotations

import asyncio
import os

import pytest

from graben.fuse._aio import Readable


class Closed(Exception):
    pass


def test_a_reader_wakes_only_to_a_readable_device_and_is_told_of_closing() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        readable = Readable(Closed)
        try:
            # Woken by a byte; the byte read, a wake the selector gave before is not passed on.
            waiting = loop.create_task(readable.wait_readable(r))
            await asyncio.sleep(0.01)
            assert not waiting.done()
            os.write(w, b"x")
            await asyncio.wait_for(waiting, 1)
            assert os.read(r, 1) == b"x"
            again = loop.create_task(readable.wait_readable(r))
            await asyncio.sleep(0)
            readable._ready(r)  # a stale word from the selector: nothing to read
            await asyncio.sleep(0.01)
            assert not again.done()
            os.write(w, b"y")
            await asyncio.wait_for(again, 1)
            os.read(r, 1)
            # With nobody waiting, the device leaves the selector after two wakes.
            os.write(w, b"z")
            for _ in range(5):
                await asyncio.sleep(0)
            assert not loop.remove_reader(r)
            last = loop.create_task(readable.wait_readable(r))
            await asyncio.wait_for(last, 1)  # in again, and the byte is there
            os.read(r, 1)
            closing = loop.create_task(readable.wait_readable(r))
            await asyncio.sleep(0)
            readable.close()
            with pytest.raises(Closed):
                await asyncio.wait_for(closing, 1)
            assert not loop.remove_reader(r)
        finally:
            os.close(r)
            os.close(w)

    asyncio.run(scenario())
