"""``graben bench meta-latency``: its rows, its skips, what it leaves behind.

The proxy it stands on is tested in ``test_delay.py``; ``--target`` skipping
it, with the other cluster workloads, in ``test_bench.py``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from graben.bench import discover
from graben.store.cli._main import main


def test_meta_latency_is_skipped_saying_why_without_postgresql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    discover()  # importing a workload module first would register its workloads out of order
    from graben.bench._postgres import NoPostgres
    from graben.bench._workloads import cluster

    def no_postgres() -> None:
        raise NoPostgres("PostgreSQL is not installed (as root: apt-get install -y postgresql)")

    monkeypatch.setattr(cluster, "start_postgres", no_postgres)
    capture = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", capture)
        assert main(["bench", "meta-latency", "--quick", "--dir", str(tmp_path)]) == 0
    assert "skipped meta-latency: PostgreSQL is not installed" in capture.getvalue()


@pytest.mark.slow
def test_meta_latency_measures_writers_and_services_behind_a_delayed_postgresql(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny run of meta-latency: a real PostgreSQL behind the delaying proxy, two real
    clusters; three rows, each the baseline of the next; nothing left running after."""
    discover()  # as above
    from graben.bench._workloads import latency

    monkeypatch.setattr(latency, "FILES", {True: (40, 0.3), False: (40, 0.3)})
    capture = io.StringIO()
    out = tmp_path / "r.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", capture)
        args = ["bench", "meta-latency", "--quick", "--dir", str(tmp_path / "s")]
        assert main([*args, "--json", str(out)]) == 0
    if "skipped meta-latency" in capture.getvalue():
        pytest.skip(capture.getvalue().partition("skipped ")[2].strip())
    rows = json.loads(out.read_text())["results"]
    systems = [
        "PostgreSQL +2 ms latency, 1 service, 1 writer",
        "PostgreSQL +2 ms latency, 1 service, 64 writers",
        "PostgreSQL +2 ms latency, 2 services, 64 writers",
    ]
    assert [r["system"] for r in rows] == systems
    assert [r["baseline"] for r in rows] == [systems[0], *systems[:2]]
    assert all(r["value"] > 0 and r["unit"] == "files/s" for r in rows)
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, check=False)
    assert left.stdout == b"", "a server outlived the run"
    proxies = ["pgrep", "-P", str(os.getpid()), "-f", "graben.bench._delay"]
    assert subprocess.run(proxies, capture_output=True, check=False).stdout == b""
