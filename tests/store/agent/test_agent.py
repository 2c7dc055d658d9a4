"""Real memory agents on loopback: segments reserved, written, found, copied to a peer,
pulled back by a replacement host, kept within the limit, adopted after a restart."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest
from agent_kit import Agents
from ranks_kit import free_port

from graben.store import (
    AgentClient,
    InvalidArgument,
    NoSpace,
    NotFound,
    PermissionDenied,
    SegmentKey,
    Unavailable,
)

MB = 1 << 20
JOB = "graben://127.0.0.1:7100/runs/a"


@pytest.fixture
def agents() -> Iterator[Agents]:
    with Agents() as made:
        yield made


def put(
    client: AgentClient, key: SegmentKey, data: bytes, *, done: bool = True, to_store: bool = True
) -> None:
    path = client.reserve(key, len(data), to_store=to_store)
    with open(path, "r+b") as f:
        f.write(data)
    if done:
        client.done(key, halves(data))


def read(path: str) -> bytes:
    return Path(path).read_bytes()


def halves(data: bytes) -> list[tuple[int, int]]:
    """The ranges a writer names with ``done``: the agent hashes each (here, two halves)."""
    half = max(len(data) // 2, 1)
    return [(0, half)] + ([(half, len(data) - half)] if len(data) > half else [])


def sums(data: bytes) -> list[tuple[int, int, bytes]]:
    return [(o, n, blake3.blake3(data[o : o + n]).digest()) for o, n in halves(data)]


def wait_for(check: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.05)


def test_a_segment_is_complete_only_once_done(agents: Agents) -> None:
    client = AgentClient(agents.start("a"))
    key = SegmentKey(JOB, 7, 1, 2)
    data = os.urandom(3 * MB)
    put(client, key, data, done=False)
    assert client.steps(JOB, 1, 2) == []
    with pytest.raises(NotFound):
        client.locate(key)
    client.done(key, halves(data))
    assert client.steps(JOB, 1, 2) == [7]
    assert client.steps(JOB, 0, 2) == [] and client.steps(JOB, 1, 4) == []
    located = client.locate(key)
    assert read(located.path) == data
    assert (located.size, located.sums) == (len(data), sums(data))  # hashed once done
    assert client.status().held_bytes == 3 * MB


def test_the_limit_holds_and_segments_go_only_once_stored(agents: Agents) -> None:
    client = AgentClient(agents.start("a", "100M", keep=1))
    one, two, three = (SegmentKey(JOB, s, 0, 1) for s in (1, 2, 3))
    put(client, one, b"1" * 40 * MB)
    put(client, two, b"2" * 40 * MB)
    with pytest.raises(NoSpace, match="must keep"):
        client.reserve(three, 40 * MB)  # step 1 is the store's only chance: nothing stored
    client.stored(JOB, 1)
    first = client.locate(one).path
    put(client, three, b"3" * 40 * MB)  # takes over step 1's pages
    assert not Path(first).exists()
    assert client.steps(JOB, 0, 1) == [2, 3]
    assert client.status().held_bytes <= 100 * MB
    client.stored(JOB, 3)
    put(client, SegmentKey(JOB, 4, 0, 1), b"4" * 40 * MB, to_store=False)
    put(client, SegmentKey(JOB, 5, 0, 1), b"5" * 40 * MB, to_store=False)
    put(client, SegmentKey(JOB, 6, 0, 1), b"6" * 40 * MB, to_store=False)  # 4 is superseded
    assert client.steps(JOB, 0, 1) == [5, 6]
    with pytest.raises(NoSpace, match="over the agent's limit"):
        client.reserve(SegmentKey(JOB, 4, 0, 1), 101 * MB)


def test_a_peer_copy_survives_the_host_and_a_replacement_pulls_it(agents: Agents) -> None:
    agents.start("b")
    a = AgentClient(agents.start("a", peers=("b",)))
    key = SegmentKey(JOB, 5, 0, 2)
    data = os.urandom(40 * MB + 3)  # more than two pieces, not a multiple of one
    put(a, key, data)
    b = AgentClient(agents.address("b"))
    wait_for(lambda: [(h.peer, h.complete) for h in b.listing(JOB)] == [(True, True)])
    agents.kill("a")
    agents.wipe("a")  # the host is gone, and its memory with it
    c = AgentClient(agents.start("c", peers=("b",)))
    assert c.steps(JOB, 0, 2) == [5]
    located = c.locate(key)
    assert located.path.startswith(str(agents.dir("c"))) and read(located.path) == data
    assert located.sums == sums(data)  # hashed by the first, checked by both others


def test_a_restarted_agent_adopts_what_its_memory_still_holds(agents: Agents) -> None:
    client = AgentClient(agents.start("a"))
    put(client, SegmentKey(JOB, 1, 0, 1), b"x" * MB)
    put(client, SegmentKey(JOB, 2, 0, 1), b"y" * MB, done=False)  # its writer dies
    agents.kill("a")
    client.close()
    agents.start("a")
    assert client.steps(JOB, 0, 1) == [1]
    assert not list(agents.dir("a").rglob("*.part"))
    agents.kill("a")
    agents.wipe("a")  # the host rebooted: nothing left in memory
    agents.start("a")
    client.close()
    assert client.steps(JOB, 0, 1) == []


def test_an_agent_killed_before_it_hashed_a_done_step_hashes_it_when_it_starts_again(
    agents: Agents,
) -> None:
    client = AgentClient(agents.start("a"))
    key, data = SegmentKey(JOB, 7, 0, 1), os.urandom(256 * MB)  # ~0.1 s to hash
    put(client, key, data)  # answered before the agent hashes it...
    agents.kill("a")  # ...and killed at once, the hash unrecorded (most runs)
    client.close()
    agents.start("a")
    assert client.steps(JOB, 0, 1) == [7]  # kept: the step is not lost with the agent
    located = client.locate(key)
    assert located.sums == sums(data) and read(located.path) == data
    assert not list(agents.dir("a").rglob("*.ranges"))


def test_bad_calls_are_refused_and_the_agent_stays_up(agents: Agents) -> None:
    address = agents.start("a")
    client = AgentClient(address)
    for key in (
        SegmentKey(JOB, -1, 0, 1),
        SegmentKey(JOB, 1, 2, 2),
        SegmentKey("", 1, 0, 1),
        SegmentKey("j" * 5000, 1, 0, 1),
    ):
        with pytest.raises(InvalidArgument):
            client.reserve(key, 10)
    with pytest.raises(PermissionDenied):
        AgentClient(address, token="not-the-token").steps(JOB, 0, 1)
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(os.urandom(4096))
    with pytest.raises(Unavailable):
        AgentClient("127.0.0.1:1").steps(JOB, 0, 1)
    put(client, SegmentKey(JOB, 1, 0, 1), b"still here")
    assert client.steps(JOB, 0, 1) == [1]
    assert client.drop("another job") == 0
    assert client.drop(JOB) == 1 and client.steps(JOB, 0, 1) == []


def test_the_agent_s_metrics_and_status(agents: Agents) -> None:
    port = free_port()
    client = AgentClient(agents.start("a", "64M", extra=("--metrics", f"127.0.0.1:{port}")))
    put(client, SegmentKey(JOB, 1, 0, 1), b"m" * MB)
    with pytest.raises(NoSpace):
        client.reserve(SegmentKey(JOB, 2, 0, 1), 65 * MB)
    client.stored(JOB, 1)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line[:1] != "#")
    assert float(values["graben_agent_held_bytes"]) == MB
    assert float(values["graben_agent_limit_bytes"]) == 64 * MB
    assert float(values["graben_agent_refused_total"]) == 1
    assert float(values["graben_agent_stored_total"]) == 1
    said = subprocess.run(
        [sys.executable, "-m", "graben.store.cli", "agent", "status", "--agent", client.address],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"1 segments, {MB} of {64 * MB} bytes" in said


def test_a_directory_the_agent_cannot_make_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    argv = [sys.executable, "-m", "graben.store.cli", "agent", "serve", "--memory-limit", "1G"]
    argv += ["--dir", str(tmp_path / "file" / "agent"), "--listen", "127.0.0.1:0"]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(tmp_path / "file") in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--memory-limit", "banana"], "--memory-limit"),
        (["--memory-limit", "1G", "--peer", "nohost"], "is not HOST:PORT"),
        (["--memory-limit", "1G", "--keep", "0"], "--keep is at least 1"),
        ([], "--memory-limit"),
    ],
)
def test_wrong_flags_get_one_clear_line(args: list[str], says: str) -> None:
    argv = [sys.executable, "-m", "graben.store.cli", "agent", "serve", *args]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_a_hung_peer_costs_a_rank_nothing_of_its_own(agents: Agents) -> None:
    agents.start("b")
    a = AgentClient(agents.start("a", peers=("b",)))
    key = SegmentKey(JOB, 3, 0, 1)
    put(a, key, b"mine" * MB)
    agents.procs["b"].send_signal(signal.SIGSTOP)
    try:
        began = time.monotonic()
        assert a.steps(JOB, 0, 1) == [3]  # the peer's answer is given up on, not the rank's
        assert read(a.locate(key).path) == b"mine" * MB
        assert time.monotonic() - began < 4.5
        with pytest.raises(NotFound):  # only the peer could have had it
            a.locate(SegmentKey(JOB, 2, 0, 1))
    finally:
        agents.procs["b"].send_signal(signal.SIGCONT)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_shared_memory_is_no_space_at_reserve_never_a_crash_later(
    agents: Agents, tmp_path: Path
) -> None:
    """/dev/shm smaller than the limit: the pages are taken when a segment is reserved, so
    the rank hears NoSpace then, instead of dying of SIGBUS while it copies."""
    small = tmp_path / "shm"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], check=True)
    try:
        agents.dirs["a"] = small / "agent"
        client = AgentClient(agents.start("a", "64M"))
        with pytest.raises(NoSpace):
            client.reserve(SegmentKey(JOB, 1, 0, 1), 20 * MB)
        assert not list((small / "agent").rglob("0*"))  # the file it began is gone
        put(client, SegmentKey(JOB, 2, 0, 1), b"f" * MB)  # what fits still does
        assert client.steps(JOB, 0, 1) == [2]
        agents.kill("a")
    finally:
        subprocess.run(["umount", str(small)], check=True)
