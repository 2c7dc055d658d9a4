"""Server logs: one line per event with time, level and component; repeats held back."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from graben.store import LogFormatter, connect
from graben.store.cli._logs import Repeats
from graben.store.local import spawn, stop, wait_for_nodes

LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR) graben\.\w+: "
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, *args: object, name: str = "graben.meta") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


def test_alike_records_pass_once_per_interval_then_with_their_count() -> None:
    clock = Clock()
    repeats = Repeats(10.0, clock)
    passed = []
    for second in range(25):  # "cannot repair chunk c<i>" every second for 25 s
        clock.now = 1000.0 + second
        for chunk in ("c1", "c2"):
            record = _record("cannot repair chunk %s yet", chunk)
            if repeats.filter(record):
                passed.append((second, record.getMessage()))
    assert passed == [
        (0, "cannot repair chunk c1 yet"),
        (10, "cannot repair chunk c1 yet (repeated 19 times in the last 10 s)"),
        (20, "cannot repair chunk c1 yet (repeated 19 times in the last 10 s)"),
    ]


def test_other_messages_loggers_and_levels_are_not_held_back() -> None:
    clock = Clock()
    repeats = Repeats(10.0, clock)
    assert repeats.filter(_record("node %s is dead", "a"))
    assert repeats.filter(_record("cannot repair chunk %s yet", "a"))
    assert repeats.filter(_record("node %s is dead", "a", name="graben.node"))
    error = _record("node %s is dead", "b")
    error.levelno = logging.ERROR
    assert repeats.filter(error)
    assert not repeats.filter(_record("node %s is dead", "c"))
    clock.now += 10.0
    again = _record("node %s is dead", "d")
    assert repeats.filter(again)
    assert again.getMessage() == "node d is dead (repeated 1 times in the last 10 s)"


def test_a_name_with_a_newline_cannot_forge_a_log_line() -> None:
    """A path a client chose, logged by a server, stays on its record's one line."""
    line = LogFormatter().format(_record("cannot read %s", "/a\n2026-11-29 WARNING forged\x1b[2J"))
    assert "\n" not in line and LINE.match(line)
    assert line.endswith("cannot read /a\\n2026-11-29 WARNING forged\\x1b[2J")
    mount = LogFormatter("mount /mnt/a\nb pid 7").format(_record("mounted"))
    assert re.search(r"WARNING mount /mnt/a\\nb pid 7 graben\.meta: mounted$", mount)


def test_a_meta_service_that_cannot_repair_logs_a_few_lines_not_one_per_chunk(
    tmp_path: Path,
) -> None:
    log = tmp_path / "meta.log"
    with log.open("w") as stderr:
        meta = subprocess.Popen(
            [
                *(sys.executable, "-m", "graben.store.cli", "meta", "serve", "--init"),
                *("--engine", f"sqlite:///{tmp_path / 'meta.db'}", "--listen", "127.0.0.1:0"),
                # longer than a node's heartbeat (2 s), or three nodes are rarely alive at once
                *("--heartbeat-timeout", "3", "--repair-interval", "0.2"),
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    nodes = []
    try:
        assert meta.stdout is not None
        address = meta.stdout.readline().strip().removeprefix("listening on ")
        started = time.time()
        for i in range(3):
            nodes.append(
                spawn(
                    *("node", "serve", "--data", str(tmp_path / f"n{i}"), "--meta", address),
                    *("--rack", f"r{i}", "--listen", "127.0.0.1:0"),
                )[0]
            )
        url = f"graben://{address}"
        wait_for_nodes(url, 3, since=started)
        with connect(url, chunk_size=4096) as client:
            client.put("/fourteen-chunks", os.urandom(14 * 4096))
        stop(nodes[1:])  # two of three gone: no chunk can get its copies back
        time.sleep(8.0)  # past the heartbeat timeout, then ~25 repair rounds
        meta.send_signal(signal.SIGTERM)
        meta.wait(10)
    finally:
        stop([meta, *nodes])
    lines = log.read_text().splitlines()
    repairs = [line for line in lines if "cannot repair" in line]
    assert 1 <= len(repairs) <= 2, lines
    assert "cannot repair 14 chunks yet" in repairs[0]
    assert all(LINE.match(line) for line in lines), lines
