"""The status page (``graben meta serve --status``) of a real cluster on loopback, read
with urllib and in a real browser (headless Chromium, skipped where none is installed).

The screenshot ``test_the_operator_sees_the_cluster_in_a_browser`` takes is kept as
``.venv/artefacts/status.png`` (the test prints where).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_kit import Agents
from cluster_kit import LocalCluster

from graben.store import AgentClient, Client, QuotaState, SegmentKey, connect
from graben.store._types import Health, NodeState, ServiceState
from graben.store.meta._status import AgentState, ClassRule, Job, JobStep, View
from graben.store.meta._status_html import render

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium here (apt-get install chromium; make system-deps)"
)
HEARTBEAT_TIMEOUT = 3.0
HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"


@pytest.fixture(scope="module")
def agents() -> Iterator[Agents]:
    with Agents() as made:
        yield made


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, agents: Agents) -> Iterator[LocalCluster]:
    agent = agents.start("a")
    with LocalCluster(
        tmp_path_factory.mktemp("status"),
        2,
        replication=2,
        timeout=HEARTBEAT_TIMEOUT,
        status="127.0.0.1:0",
        meta_args=("--status-agents", f"{agent},127.0.0.1:1"),  # the second: nobody
    ) as made:
        yield made


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[Client]:
    with connect(cluster.url) as made:
        yield made


@pytest.fixture(scope="module")
def operator(cluster: LocalCluster) -> str:
    """The cluster's own token, as ``graben token cluster`` prints it."""
    done = subprocess.run(
        [sys.executable, "-m", "graben.store.cli", "token", "cluster"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def fetch(cluster: LocalCluster, path: str, **headers: str) -> tuple[int, dict[str, str], str]:
    """``path`` of the page: its status, headers and body (redirects not followed)."""

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    request = urllib.request.Request(f"http://{cluster.status_address}{path}", headers=headers)
    try:
        with urllib.request.build_opener(Stay).open(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def view(cluster: LocalCluster, token: str) -> dict[str, Any]:
    code, _, body = fetch(cluster, "/status.json", Authorization=f"Bearer {token}")
    assert code == 200, body
    found: dict[str, Any] = json.loads(body)
    return found


def browse(cluster: LocalCluster, token: str, profile: Path, screenshot: Path | None = None) -> str:
    """The page as Chromium renders it (its DOM), the token passed once as ``?token=``
    (then kept in the cookie, as a person's browser does); a screenshot if asked."""
    assert CHROMIUM is not None
    url = f"http://{cluster.status_address}/?token={token}"
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    argv += [f"--user-data-dir={profile}", "--virtual-time-budget=3000"]
    dump = [*argv, "--dump-dom", url]
    done = subprocess.run(dump, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    if screenshot is not None:
        shot = [*argv, f"--screenshot={screenshot}", "--window-size=1000,1250", url]
        subprocess.run(shot, capture_output=True, timeout=60, check=True)
    return done.stdout


def until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "did not happen in time"
        time.sleep(0.3)


def test_the_page_is_off_without_the_flag(tmp_path: Path) -> None:
    """A service started without --status says no page, and none of its ports serves one."""
    argv = [sys.executable, "-m", "graben.store.cli", "meta", "serve", "--init"]
    argv += ["--engine", f"sqlite:///{tmp_path / 'meta.db'}", "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("listening on ")
        for port in _listening(proc.pid):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as reply:
                    assert "graben status" not in reply.read().decode()
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not HTTP at all (the service's own port), or nothing at /
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert "status page" not in out + err


def _listening(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = str(fd.readlink()) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            ports.append(int(fields[1].rpartition(":")[2], 16))
    return ports


def test_every_text_a_view_holds_is_escaped() -> None:
    """Without a browser: each field a person may choose, hostile, stays text."""
    node = NodeState("n<i>", f"h{HOSTILE}:1", f"r{HOSTILE}", 0, 0, state=HOSTILE)
    service = ServiceState(f"s{HOSTILE}", f"a{HOSTILE}", "sqlite", 0.0, 0.0)
    health = Health([node], 0, 0, 3, HOSTILE, [service], "", 0, f"sqlite:///{HOSTILE}")
    quota = QuotaState(f"/q{HOSTILE}", "t", 1, 0, 0, 2, 0, 0)
    shown = render(
        View(
            "operator",
            "",
            0.0,
            [quota],
            [Job(f"graben://h/{HOSTILE}", [JobStep(1, "store")], error=HOSTILE)],
            health,
            {"t": f"/r{HOSTILE}"},
            [ClassRule(f"/c{HOSTILE}", HOSTILE)],
            agents=[AgentState(f"a{HOSTILE}", error=HOSTILE)],
        )
    )
    assert "<img" not in shown and "<i>" not in shown
    assert shown.count("&lt;img src=x onerror=&quot;") >= 12


def test_no_token_or_a_bad_one_gets_a_401_page_saying_how_to_pass_one(
    cluster: LocalCluster,
) -> None:
    code, headers, body = fetch(cluster, "/")
    assert code == 401 and "Authorization: Bearer TOKEN" in body and "?token=" in body
    assert headers["WWW-Authenticate"].startswith("Bearer")
    code, headers, _ = fetch(cluster, "/status.json", Authorization="Bearer nonsense")
    assert code == 401
    code, headers, _ = fetch(cluster, "/?token=gbt_0123456789ab_" + "0" * 64)
    assert code == 401 and "Set-Cookie" not in headers  # a refused token is never kept
    code, headers, _ = fetch(cluster, "/", Cookie="graben_token=nonsense")
    assert code == 401 and "Max-Age=0" in headers["Set-Cookie"]  # a bad cookie is forgotten


def test_a_token_in_the_address_is_kept_in_a_strict_cookie_and_taken_out(
    cluster: LocalCluster, operator: str
) -> None:
    code, headers, _ = fetch(cluster, f"/status.json?token={operator}")
    assert code == 303 and headers["Location"] == "/status.json"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    code, headers, body = fetch(cluster, "/status.json", Cookie=cookie.partition(";")[0])
    assert code == 200 and json.loads(body)["viewer"] == "operator"
    assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'none'
    code, _, _ = fetch(cluster, "/", Authorization=f"Bearer {operator}")
    assert code == 200
    assert fetch(cluster, "/nothing", Authorization=f"Bearer {operator}")[0] == 404


@needs_browser
def test_the_operator_sees_the_cluster_in_a_browser(
    cluster: LocalCluster, client: Client, operator: str, tmp_path: Path
) -> None:
    """Kept: ``.venv/artefacts/status.png``, the page as Chromium shows it."""
    client.put("/warm/up", b"x" * 100_000)
    time.sleep(2.5)  # a sample of the request counters with the writes in it
    shot = Path(sys.prefix) / "artefacts" / "status.png"
    shot.parent.mkdir(exist_ok=True)
    dom = browse(cluster, operator, tmp_path / "profile", shot)
    print(f"screenshot: {shot}")
    assert "Data nodes: 2 of 2 alive" in dom
    assert "leader (fence" in dom and cluster.meta_address in dom
    assert "chunks short of copies" in dom and "<svg" in dom and "<polyline" in dom
    assert shot.stat().st_size > 10_000


def test_a_tenant_sees_its_own_usage_and_nothing_of_the_cluster(
    cluster: LocalCluster, client: Client, tmp_path: Path
) -> None:
    client.add_tenant("ta", "/teams/ta", max_bytes=10 << 20)
    client.add_tenant("tb", "/teams/tb", max_bytes=20 << 20)
    token = client.issue_token("ta", rights="r")
    seen = view(cluster, token)
    assert seen["viewer"] == "ta" and seen["health"] is None and seen["throughput"] == []
    assert [q["path"] for q in seen["quotas"]] == ["/teams/ta"]
    assert seen["tenants"] == {} and seen["agents"] == []
    if CHROMIUM is not None:
        dom = browse(cluster, token, tmp_path / "profile")
        assert "/teams/ta" in dom and "tenant ta" in dom
        assert "/teams/tb" not in dom and "Data nodes" not in dom and "127.0.0.1" not in dom


def test_a_memory_tier_job_shows_with_its_steps_and_tiers(
    cluster: LocalCluster, client: Client, agents: Agents, operator: str
) -> None:
    address = agents.address("a")
    job = f"{cluster.url}/jobs/j1"
    memory = AgentClient(address)
    for step, world in ((1, 1), (2, 1), (3, 2)):  # step 3: one rank of two, here
        key = SegmentKey(job, step, 0, world)
        Path(memory.reserve(key, 4096)).write_bytes(b"s" * 4096)
        memory.done(key, [(0, 4096)])
    client.put("/jobs/j1/step-000000000001/.metadata", b"m")  # the store holds step 1
    client.put("/jobs/j1/step-000000000000/.metadata", b"m")  # ...and step 0 alone
    until(lambda: job in {j["url"] for j in view(cluster, operator)["jobs"]})
    jobs = {j["url"]: j for j in view(cluster, operator)["jobs"]}
    tiers = {s["step"]: s["tiers"] for s in jobs[job]["steps"]}
    assert tiers == {0: "store", 1: "memory+store", 2: "memory", 3: "memory 1/2 ranks"}
    agent, nobody = view(cluster, operator)["agents"]
    assert agent["address"] == address and agent["segments"] == 3 and not agent["error"]
    assert nobody["address"] == "127.0.0.1:1" and nobody["error"]  # said, and the rest shown
    client.add_tenant("tj", "/teams/tj")
    outsider = client.issue_token("tj", rights="r")
    assert view(cluster, outsider)["jobs"] == []  # not below its prefix


@needs_browser
def test_hostile_paths_and_job_names_render_escaped(
    cluster: LocalCluster, client: Client, agents: Agents, operator: str, tmp_path: Path
) -> None:
    """Paths and job names are anyone's text (tenant names are [a-z0-9_.-] only)."""
    root = f"/teams/x{HOSTILE}"
    client.add_tenant("hostile", root, max_files=10)
    client.mkdir(f"/c{HOSTILE}")
    client.set_class(f"/c{HOSTILE}", "ec:2+1")
    key = SegmentKey(f"graben://h:1/j{HOSTILE}", 1, 0, 1)
    memory = AgentClient(agents.address("a"))
    Path(memory.reserve(key, 16)).write_bytes(b"s" * 16)
    memory.done(key, [(0, 16)])
    until(lambda: "hostile" in view(cluster, operator)["tenants"])  # the page's figures anew
    dom = browse(cluster, operator, tmp_path / "profile")
    assert "<img" not in dom and "pwned" not in dom.partition("<body")[0]
    shown = "&lt;img src=x onerror=\"document.title='pwned'\"&gt;"  # text, not an element
    assert f"/teams/x{shown}" in dom and f"/c{shown}" in dom and f"graben://h:1/j{shown}" in dom


def test_a_killed_node_shows_dead_within_its_heartbeat_bound(
    cluster: LocalCluster, operator: str, tmp_path: Path
) -> None:
    killed = cluster.nodes[1].pid
    cluster.kill(1)  # SIGKILL by its pid
    started = time.monotonic()
    while True:
        nodes = view(cluster, operator)["health"]["nodes"]
        if [n["alive"] for n in nodes].count(False) == 1:
            break
        time.sleep(0.2)
        # the timeout, a heartbeat's interval (2 s) and the page's freshness (2 s)
        assert time.monotonic() - started < HEARTBEAT_TIMEOUT + 2 + 2 + 1, f"pid {killed}"
    if CHROMIUM is not None:
        dom = browse(cluster, operator, tmp_path / "profile")
        assert "Data nodes: 1 of 2 alive" in dom and ">dead<" in dom
