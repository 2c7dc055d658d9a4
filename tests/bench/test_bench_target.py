"""``graben bench --target``: a deployed cluster or any mounted directory, nothing of the
bench's own started, nothing left behind."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from bench_kit import quiet_run

from graben.store import connect
from graben.store.cli._main import main


@pytest.mark.slow
def test_a_target_directory_runs_the_mount_workloads_there_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """``--target DIR``: any mounted directory (here the test's own), nothing started; the
    write rows have a durable twin, since whether its fsync syncs is not known."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "mine.txt").write_text("kept")
    rows = quiet_run(tmp_path, "--target", str(target), "--size-mib", "4")
    name = f"target {target}"
    assert {r["workload"] for r in rows} >= {"mount-create", "mount-stat", "mount-write"}
    tools = {r["system"] for r in rows if r["workload"] == "mount-tools"}  # beside the disk
    assert {"find: local disk", f"find: {name}", f"git status: {name}"} <= tools
    systems = {r["system"] for r in rows if r["workload"] != "mount-tools"}
    assert systems == {name, f"{name}, then sync", "plain file, page cache"}
    assert ("mount-create", f"{name}, then sync") in {(r["workload"], r["system"]) for r in rows}
    assert [p.name for p in target.iterdir()] == ["mine.txt"]


@pytest.mark.slow
def test_a_target_cluster_runs_the_cluster_workloads_on_it(
    cluster_url: str, tmp_path: Path
) -> None:
    """``--target graben://...``: the cluster workloads measure that cluster; nothing of
    the bench's own is started (its TLS cluster and PostgreSQL clusters are left out)."""
    capture = io.StringIO()
    out = tmp_path / "r.json"
    with connect(cluster_url) as client:
        before = [e.name for e in client.ls("/")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", capture)
        args = ["bench", "cluster-read", "cluster-tls-read", "meta-latency"]
        args += ["--target", cluster_url]
        args += ["--size-mib", "4", "--dir", str(tmp_path / "s"), "--json", str(out)]
        assert main(args) == 0
    rows = json.loads(out.read_text())["results"]
    assert ("cluster-read", "graben cluster") in {(r["workload"], r["system"]) for r in rows}
    for skipped in ("cluster-tls-read", "meta-latency"):
        assert f"skipped {skipped}: --target: no cluster of the bench's own" in capture.getvalue()
    with connect(cluster_url) as client:
        assert [e.name for e in client.ls("/")] == before  # what it wrote is gone, dir too


def test_a_target_that_is_neither_a_store_nor_a_directory_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--target", str(tmp_path / "nowhere")]) == 1  # as an unknown name
    assert "not a graben:// URL nor a directory" in capsys.readouterr().err
