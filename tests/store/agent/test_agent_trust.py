"""What a memory agent trusts: its own directory only, and callers by their tokens.

Real ``graben agent serve`` processes. Another local user (uid 65534, made
by ``setuid`` in a child process, so these tests need root) plants the
agent's directory or a job's; a link stands for the directory; a segment's
record is forged; tenants' tokens of a real cluster reach their own jobs.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest
from agent_kit import Agents

from graben.store import AgentClient, PermissionDenied, SegmentKey, connect
from graben.store.wire import Connection, decode, encode

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")
WHOLE = [(0, 1024)]
"""The ranges a writer names: here the whole of a 1 KiB segment."""


@pytest.fixture
def agents() -> Iterator[Agents]:
    with Agents() as made:
        yield made


def serve(where: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``graben agent serve --dir where`` that is expected to refuse to start."""
    argv = [sys.executable, "-m", "graben.store.cli", "agent", "serve", "--memory-limit", "64M"]
    argv += ["--dir", str(where), "--listen", "127.0.0.1:0", *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def job_dir(job: str) -> str:
    return hashlib.sha256(job.encode()).hexdigest()[:24]


def as_nobody(script: str) -> None:
    """Run shell ``script`` as uid 65534, as another user of the machine would."""
    subprocess.run(
        ["/bin/sh", "-ec", script], user=NOBODY, group=NOBODY, cwd="/", check=True, timeout=60
    )


@pytest.fixture
def shm() -> Iterator[Path]:
    """A fresh name in /dev/shm (sticky, writable by all), removed afterwards."""
    where = Path(f"/dev/shm/graben-test-trust-{uuid.uuid4().hex[:8]}")
    yield where
    shutil.rmtree(where, ignore_errors=True)


JOB = "graben://127.0.0.1:7100/runs/a"


@as_root
def test_a_directory_another_user_made_first_is_refused(shm: Path) -> None:
    planted = shm / "own" / job_dir(JOB)
    as_nobody(
        f"mkdir -p {planted} && chmod 777 {shm} {shm / 'own'} {planted}\n"
        f"printf %s '{JOB}' > {planted / 'job'}\n"
        f"printf 'patched floats' > {planted / '000000000009-0-of-1'}"
    )
    refused(serve(shm), f"uid {NOBODY}", str(shm))
    assert (planted / "000000000009-0-of-1").read_bytes() == b"patched floats"  # untouched


@as_root
def test_a_job_directory_of_another_user_inside_ours_is_refused(shm: Path) -> None:
    planted = shm / "own" / job_dir(JOB)
    planted.mkdir(parents=True, mode=0o700)
    shm.chmod(0o700)
    (shm / "own").chmod(0o700)
    os.chown(planted, NOBODY, NOBODY)  # left by a user who could once write there
    planted.chmod(0o777)
    refused(serve(shm), f"uid {NOBODY}", str(planted))


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: (p.mkdir(), p.chmod(0o777)), "writable by others"),
        (lambda p: (p.mkdir(), p.chmod(0o770)), "writable by its group"),
        (
            lambda p: (
                p.with_name(p.name + "-real").mkdir(mode=0o700),
                p.symlink_to(p.name + "-real"),
            ),
            "symbolic link",
        ),
    ],
)
def test_an_open_or_linked_directory_is_refused(shm: Path, make: object, words: str) -> None:
    try:
        make(shm)  # type: ignore[operator]
        refused(serve(shm), words, str(shm))
    finally:
        if shm.is_symlink():
            shm.unlink()
        shutil.rmtree(shm.with_name(shm.name + "-real"), ignore_errors=True)


def test_what_the_agent_makes_is_its_own_alone(agents: Agents) -> None:
    client = AgentClient(agents.start("a"))
    key = SegmentKey(JOB, 3, 0, 1)
    path = Path(client.reserve(key, 1024))
    path.write_bytes(b"s" * 1024)
    client.done(key, WHOLE)
    root = agents.dir("a")
    for directory in (root, root / "own", root / "peer", root / "own" / job_dir(JOB)):
        st = directory.lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, directory
    for file in (root / "own" / job_dir(JOB)).iterdir():
        st = file.lstat()
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, file
    assert client.locate(key).sums == [(0, 1024, blake3.blake3(b"s" * 1024).digest())]
    client.close()


def test_a_restarted_agent_adopts_only_segments_whose_record_it_signed(agents: Agents) -> None:
    client = AgentClient(agents.start("a"))
    for step in (1, 2, 3):
        key = SegmentKey(JOB, step, 0, 1)
        Path(client.reserve(key, 1024, to_store=True)).write_bytes(bytes([step]) * 1024)
        client.done(key, WHOLE)
    assert client.locate(SegmentKey(JOB, 3, 0, 1)).size == 1024  # hashed by now
    client.close()
    agents.kill("a")
    job = agents.dir("a") / "own" / job_dir(JOB)
    record = (job / "000000000002-0-of-1.sum").read_bytes()
    ours = blake3.blake3(bytes([2]) * 1024).digest()
    forged = record.replace(ours, blake3.blake3(b"patched" * 100).digest())
    assert forged != record
    (job / "000000000002-0-of-1.sum").write_bytes(forged)  # another sum, the old tag
    (job / "000000000003-0-of-1.sum").unlink()
    agents.start("a")
    assert client.steps(JOB, 0, 1) == [1]
    assert sorted(p.name for p in job.iterdir()) == [
        "000000000001-0-of-1",
        "000000000001-0-of-1.sum",
        "job",
    ]
    client.close()


# -- tenants' tokens ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tenant(cluster_url: str) -> Iterator[tuple[str, str, str]]:
    """A tenant of the session's cluster: its root, an rw token and an r token for it."""
    name = f"t{uuid.uuid4().hex[:8]}"
    root = f"/agent-{name}"
    with connect(cluster_url) as operator:
        operator.add_tenant(name, root)
        rw = operator.issue_token(name, prefix=f"{root}/a", rights="rw", ttl_s=600)
        r = operator.issue_token(name, prefix=f"{root}/a", rights="r", ttl_s=600)
        yield root, rw, r
        operator.revoke_tokens(tenant=name)


def _raw(address: str, op: str, token: str) -> object:
    """``op`` sent by a wire client of our own, none of AgentClient's checks on the way
    (``agent.held``, every job's segments, is the status page's: the cluster's alone)."""

    async def call() -> object:
        host, _, port = address.rpartition(":")
        conn = await Connection.open(host, int(port))
        try:
            reply, _ = await conn.call(op, encode(None), token=token)
            return decode(reply, object)
        finally:
            await conn.close()

    return asyncio.run(call())


def meta_of(cluster_url: str) -> str:
    return cluster_url.removeprefix("graben://").rstrip("/")


def test_a_tenant_s_token_reaches_its_own_jobs_only(
    agents: Agents, cluster_url: str, tenant: tuple[str, str, str]
) -> None:
    root, rw, r = tenant
    address = agents.start("a", extra=("--meta", meta_of(cluster_url)))
    mine, theirs = f"{cluster_url}{root}/a/job", f"{cluster_url}{root}/b/job"
    writer = AgentClient(address, token=rw)
    key = SegmentKey(mine, 1, 0, 1)
    Path(writer.reserve(key, 1024)).write_bytes(b"t" * 1024)
    writer.done(key, WHOLE)
    reader = AgentClient(address, token=r)
    assert reader.steps(mine, 0, 1) == [1] and reader.locate(key).size == 1024
    forged = rw[:-1] + ("1" if rw.endswith("0") else "0")  # never the token itself
    for attempt, says in [
        (lambda: writer.reserve(SegmentKey(theirs, 1, 0, 1), 1024), f"reaches {root}/a only"),
        (lambda: writer.steps(theirs, 0, 1), f"reaches {root}/a only"),
        (lambda: writer.drop("/elsewhere/job"), f"reaches {root}/a only"),
        (lambda: reader.reserve(SegmentKey(mine, 2, 0, 1), 1024), "no write right"),
        (lambda: reader.drop(mine), "no write right"),
        (writer.status, "needs the cluster's secret"),
        (lambda: _raw(address, "agent.held", rw), "needs the cluster's secret"),
        (lambda: AgentClient(address, token=forged).steps(mine, 0, 1), "not known"),
    ]:
        with pytest.raises(PermissionDenied, match=says):
            attempt()
    with connect(cluster_url) as operator:
        ident = rw.split("_")[1]
        operator.revoke_tokens(ident)
    time.sleep(1.0)  # the agent asks again once its answer is 0.5 s old
    with pytest.raises(PermissionDenied, match=r"revoked|not known"):
        writer.steps(mine, 0, 1)
    for client in (writer, reader):
        client.close()


def test_without_the_metadata_service_only_the_cluster_s_token_is_taken(
    agents: Agents, cluster_url: str, tenant: tuple[str, str, str]
) -> None:
    root, _, r = tenant
    address = agents.start("a")
    with pytest.raises(PermissionDenied, match="--meta"):
        AgentClient(address, token=r).steps(f"{cluster_url}{root}/a/job", 0, 1)
