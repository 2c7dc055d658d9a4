"""The memory tier with real ranks, agents and a real cluster: what survives which failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import memory_ranks
import pytest
import torch
from agent_kit import Agents
from netns_kit import Hosts, needs_netns
from ranks_kit import free_port, stacks

from graben.checkpoint import CheckpointManager
from graben.store import AgentClient, PermissionDenied, SegmentKey, connect

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
RANKS = Path(__file__).with_name("memory_ranks.py")
KILLED = -9


@pytest.fixture
def agents() -> Iterator[Agents]:
    with Agents() as made:
        yield made


def launch(
    action: str,
    url: str,
    agents: list[str],
    *,
    steps: int = 0,
    every: int = 100,
    die_at: int = -1,
    width: int = 64,
    env: dict[str, str] | None = None,
) -> list[tuple[int, list[dict[str, object]], str]]:
    """Run one rank per agent address (``env`` added to the environment); each rank's exit
    code, JSON lines and output."""
    port = free_port()
    procs = []
    for rank, agent in enumerate(agents):
        argv = [str(RANKS), action, url, str(rank), str(len(agents)), str(port)]
        argv += [str(steps), str(every), str(die_at), str(width)]
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv],
                env={**os.environ, "GRABEN_AGENT": agent, **(env or {})},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outcomes = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            threads = stacks(proc.pid)
            proc.kill()
            out = proc.communicate()[0] + f"\n[killed after 120 s]\n{threads}"
        said = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        outcomes.append((proc.returncode, said, out))
    return outcomes


def resumed(outcomes: list[tuple[int, list[dict[str, object]], str]]) -> list[dict[str, object]]:
    for code, _, out in outcomes:
        assert code == 0, out[-4000:]
    return [said[-1] for _, said, _ in outcomes]


def digest_at(outcomes: list[tuple[int, list[dict[str, object]], str]], step: int) -> str:
    digests = {s["digest"] for _, said, _ in outcomes for s in said if s.get("saved") == step}
    assert len(digests) == 1, digests  # DDP keeps the ranks' models equal
    return str(digests.pop())


def store_latest(url: str) -> str:
    store, _, root = url.partition("//")[2].partition("/")
    with connect(f"graben://{store}") as client:
        return client.get(f"/{root}/latest").decode()


def in_process(url: str, agent: str, width: int = 64) -> tuple[int | None, str]:
    """Load the latest step here, as one rank alone (world size 1): its step and digest."""
    fresh = memory_ranks.model(width)
    state = {"model": fresh.state_dict(), "step": -1}
    with CheckpointManager(url, tiers=("memory", "store"), agent=agent) as manager:
        step = manager.load_latest(state)
    fresh.load_state_dict(state["model"])
    return step, memory_ranks.digest(fresh)


def ckpt_ls(url: str, agent: str) -> list[dict[str, object]]:
    argv = [sys.executable, "-m", "graben.store.cli", "ckpt", "ls", url, "--agent", agent]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, check=True)
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


@pytest.fixture
def url(cluster_url: str) -> str:
    return f"{cluster_url}/memory-{uuid.uuid4().hex[:8]}"


def test_a_job_killed_mid_training_resumes_from_memory_then_the_store(
    agents: Agents, url: str
) -> None:
    agent = agents.start("a")
    trained = launch("train", url, [agent, agent], steps=5, every=3, die_at=5)
    assert [code for code, _, _ in trained] == [KILLED, KILLED]
    stored = int(store_latest(url).removeprefix("step-"))
    assert stored in (1, 4)  # saves 1 and 4 went on to the store; 4 may not have got there
    tiers = {row["step"]: row["tiers"] for row in ckpt_ls(url, agent)}
    assert tiers[5] == "memory" and "store" in tiers[stored], tiers  # 1's pages took step 4
    back = resumed(launch("resume", url, [agent, agent]))
    assert [(r["step"], r["saved_step"]) for r in back] == [(5, 5), (5, 5)]
    assert {r["digest"] for r in back} == {digest_at(trained, 5)}
    agents.kill("a")
    agents.wipe("a")  # the node rebooted: its memory is gone
    agents.start("a")
    back = resumed(launch("resume", url, [agent, agent]))
    assert [r["step"] for r in back] == [stored, stored]
    assert {r["digest"] for r in back} == {digest_at(trained, stored)}


def test_a_kill_during_a_save_never_yields_a_torn_step(agents: Agents, url: str) -> None:
    agent = agents.start("a")
    trained = launch("torn", url, [agent, agent], steps=4, die_at=3)
    assert trained[1][0] == KILLED and trained[0][0] != 0
    back = resumed(launch("resume", url, [agent, agent]))
    assert [r["step"] for r in back] == [2, 2]  # rank 0 copied step 3; rank 1 never did
    assert {r["digest"] for r in back} == {digest_at(trained, 2)}


def test_another_world_size_loads_from_the_store(agents: Agents, url: str) -> None:
    agent = agents.start("a")
    trained = launch("train", url, [agent, agent], steps=4, every=2)
    assert [code for code, _, _ in trained] == [0, 0], trained[0][2][-3000:]
    assert in_process(url, agent) == (3, digest_at(trained, 3))  # step 4: memory, 2 ranks
    back = resumed(launch("resume", url, [agent, agent]))
    assert [r["step"] for r in back] == [4, 4]


def test_a_save_the_agent_has_no_room_for_goes_to_the_store_and_says_so(
    agents: Agents, url: str
) -> None:
    agent = agents.start("a", "1M")
    trained = launch("train", url, [agent, agent], steps=2, width=4096)  # ~0.6 MiB a rank
    assert [code for code, _, _ in trained] == [0, 0], trained[0][2][-3000:]
    assert "step 2 goes to the store only" in trained[0][2] + trained[1][2]
    assert store_latest(url) == "step-000000000002"
    assert in_process(url, agent, width=4096) == (2, digest_at(trained, 2))


@needs_netns
def test_a_lost_host_resumes_elsewhere_from_its_peers_copy(url: str) -> None:
    hosts = Hosts(3)  # hosts 0 and 1 run the job's agents; host 2 replaces host 0
    try:
        with Agents(hosts) as agents:
            agents.address("b", host=1)  # named before "a" starts, to be its peer
            first = agents.start("a", host=0, peers=("b",))
            second = agents.start("b", host=1, peers=("a",))
            trained = launch("train", url, [first, second], steps=3, every=100, die_at=3)
            assert [code for code, _, _ in trained] == [KILLED, KILLED]
            peer = AgentClient(second)
            job = url.rstrip("/")
            wait_for(lambda: (0, 3) in _peer_copies(peer, job))
            agents.kill("a")
            agents.wipe("a")
            hosts.cut(0)  # host 0 is gone, with its memory
            spare = agents.start("c", host=2, peers=("b",))
            back = resumed(launch("resume", url, [spare, second]))
            assert [r["step"] for r in back] == [3, 3]  # the store holds only step 1
            assert {r["digest"] for r in back} == {digest_at(trained, 3)}
            peer.close()
    finally:
        hosts.close()


def _peer_copies(agent: AgentClient, job: str) -> list[tuple[int, int]]:
    return [(h.key.rank, h.key.step) for h in agent.listing(job) if h.peer and h.complete]


def wait_for(check: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.05)


def test_saves_at_any_steps_keep_memory_bounded_and_load_the_newest(
    agents: Agents, url: str
) -> None:
    """One process, steps at uneven gaps: the segment reserved ahead of each save is the
    wrong one as often as not; none is left behind, and the newest step loads."""
    agent = agents.start("a", "64M", keep=2)
    state = {"w": torch.zeros(1024, 256), "step": 0}
    with CheckpointManager(url, tiers=("memory", "store"), agent=agent, store_every=3) as m:
        for step in (1, 2, 5, 6, 10, 11, 30, 31, 32):
            state["w"].fill_(step)
            state["step"] = step
            m.save(step, state, async_=True)
        m.wait()
    memory = AgentClient(agent)
    held = memory.listing(url)
    assert all(h.complete for h in held), held  # no reservation left behind
    assert sorted(h.key.step for h in held)[-2:] == [31, 32]
    assert memory.status().held_bytes <= 64 << 20
    memory.close()
    fresh = {"w": torch.empty(1024, 256), "step": -1}
    with CheckpointManager(url, tiers=("memory", "store"), agent=agent) as m:
        assert m.load_latest(fresh) == 32 and fresh["step"] == 32
        assert m.latest() is not None and m.latest().step == 30  # saves 1, 6, 30 stored
    assert torch.equal(fresh["w"], torch.full((1024, 256), 32.0))


def test_a_hung_agent_stalls_one_save_then_the_store_takes_them(
    agents: Agents, url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("graben.checkpoint._memory.RETRY_S", 3.0)
    agent = agents.start("a")
    state = {"w": torch.zeros(256, 256)}
    with CheckpointManager(url, tiers=("memory", "store"), agent=agent, store_every=100) as m:
        m.save(1, state)
        m.save(2, state)
        agents.procs["a"].send_signal(signal.SIGSTOP)
        try:
            began = time.monotonic()
            third = m.save(3, state).tiers
            stalled = time.monotonic() - began
            # Step 3's segment was asked for while step 2 trained: reserved before the
            # agent stopped, the copy goes there and only its confirmation stalls (the step
            # is not complete in memory, and the log says so); not yet, the save waits for
            # it and goes to the store. Either way it stalls once.
            assert third in (("memory",), ("store",))
            began = time.monotonic()
            assert m.save(4, state).tiers == ("store",)  # the agent is left alone a while
            assert time.monotonic() - began < 2.0 < stalled < 15.0
        finally:
            agents.procs["a"].send_signal(signal.SIGCONT)
        time.sleep(3.0)
        assert m.save(5, state).tiers == ("memory",)  # tried again, and it answers
    assert "did not answer" in caplog.text
    assert ("step 3 goes to the store only" in caplog.text) == (third == ("store",))
    assert ("step 3 is not complete in memory" in caplog.text) == (third == ("memory",))
    fresh = {"w": torch.ones(256, 256)}
    with CheckpointManager(url, tiers=("memory", "store"), agent=agent) as m:
        assert m.load_latest(fresh) == 5


def test_a_changed_segment_is_never_loaded(agents: Agents, url: str) -> None:
    """Step 4's floats patched in rank 0's segment, step 3's header forged in rank 1's:
    both ranks refuse both steps and load the store's (step 1), as written."""
    agent = agents.start("a")
    trained = launch("train", url, [agent, agent], steps=4, every=100)
    assert [code for code, _, _ in trained] == [0, 0], trained[0][2][-3000:]
    memory = AgentClient(agent)
    floats = Path(memory.locate(SegmentKey(url, 4, 0, 2)).path)
    with open(floats, "r+b") as f:  # the last tensor's one float (the output's bias)
        f.seek(floats.stat().st_size - 64)
        f.write(torch.tensor([1e6]).numpy().tobytes())
    header = Path(memory.locate(SegmentKey(url, 3, 1, 2)).path)
    with open(header, "r+b") as f:  # the header's last value, "step": 3, made 99
        length = int.from_bytes(f.read(8), "little")
        f.seek(8 + length - 1)
        assert f.read(1) == bytes([3])
        f.seek(8 + length - 1)
        f.write(bytes([99]))
    memory.close()
    outcomes = launch("resume", url, [agent, agent])
    back = resumed(outcomes)
    assert [(r["step"], r["saved_step"]) for r in back] == [(1, 1), (1, 1)]
    assert {r["digest"] for r in back} == {digest_at(trained, 1)}
    said = outcomes[0][2] + outcomes[1][2]
    assert "step 4 is not loaded from memory" in said and "bytes at /model/2.bias differ" in said
    assert "step 3 is not loaded from memory" in said and "header's bytes differ" in said


def test_a_tenant_s_job_saves_and_loads_through_the_memory_tier(
    agents: Agents, cluster_url: str
) -> None:
    """Ranks holding only a tenant's token (no secret): their steps go to memory and come
    back from it; the tenant's token reaches no other job there."""
    name = f"m{uuid.uuid4().hex[:8]}"
    with connect(cluster_url) as operator:
        operator.add_tenant(name, f"/{name}")
        token = operator.issue_token(name, rights="rw", ttl_s=600)
    meta = cluster_url.removeprefix("graben://")
    agent = agents.start("a", extra=("--meta", meta))
    url = f"{cluster_url}/{name}/job"
    env = {"GRABEN_TOKEN": token, "GRABEN_SECRET_FILE": "", "GRABEN_SECRET": ""}
    trained = launch("train", url, [agent, agent], steps=3, every=100, env=env)
    assert [code for code, _, _ in trained] == [0, 0], trained[0][2][-3000:]
    assert "goes to the store only" not in trained[0][2] + trained[1][2]
    back = resumed(launch("resume", url, [agent, agent], env=env))
    assert [r["step"] for r in back] == [3, 3]  # the store holds step 1 only: memory's
    assert {r["digest"] for r in back} == {digest_at(trained, 3)}
    tenant = AgentClient(agent, token=token)
    with pytest.raises(PermissionDenied, match=f"reaches /{name} only"):
        tenant.steps(f"{cluster_url}/elsewhere/job", 0, 2)
    tenant.close()
