"""``mount-tools``: the generated tree, the rows, and a tiny run with real tools and mounts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bench_kit import quiet_run

from graben.bench import _tree, discover

MiB = 1 << 20


def test_the_tree_is_the_same_every_time_nested_and_of_mixed_sizes() -> None:
    entries = _tree.shape(2000)
    assert entries == _tree.shape(2000)
    sizes = [e.size for e in entries]
    assert 40e6 < sum(sizes) < 50e6, sum(sizes)
    assert min(sizes) == 0 and 512 * 1024 < max(sizes) <= MiB
    assert max(e.path.count("/") for e in entries) >= 5
    assert len({e.path for e in entries}) == len(entries)


def test_two_writes_of_one_shape_share_no_bytes_but_the_empty_files(tmp_path: Path) -> None:
    entries = _tree.shape(60, largest=64 * 1024)
    assert _tree.write(tmp_path / "a", entries, "one") == sum(e.size for e in entries)
    _tree.write(tmp_path / "b", entries, "two")
    for e in entries:
        a, b = ((tmp_path / side / e.path).read_bytes() for side in "ab")
        assert len(a) == len(b) == e.size
        assert a != b or e.size == 0 or e.size < len(b"# one 0\n"), e.path


def test_a_failing_tool_is_a_row_that_says_so_and_has_no_ratio() -> None:
    discover()  # importing a workload module first would register its workloads out of order
    from graben.bench._workloads import tools

    ok, failed = tools.Ran(1.0), tools.Ran(4.0, "exit 1: no space")
    times = {
        tools.LOCAL: {"find": tools.Ran(0.5)},
        tools.EMBEDDED: {"find": ok},
        tools.CLUSTER_RF1: {"find": failed},
        "JuiceFS": {"find": tools.Ran(2.0)},
        "SeaweedFS": {"find": tools.Ran(3.0)},
    }
    rows = {r.system: r for r in tools._rows(times)}
    assert rows["find: graben cluster RF=1, failed (exit 1: no space)"].value == 4.0
    assert rows["find: graben embedded vs the faster peer"].value == 2.0  # JuiceFS's 2 s / 1 s
    assert "find: graben cluster RF=1 vs the faster peer" not in rows
    assert {r.baseline for r in rows.values() if r.unit == "s"} == {"find: local disk"}


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync")
def test_mount_tools_runs_every_tool_on_the_local_disk_and_graben_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny tree through the real tools on the local disk and graben's embedded mount,
    beside JuiceFS where it is installed (SeaweedFS and the cluster: in the bench runs);
    every tool succeeds, and nothing is left mounted or running."""
    discover()
    from graben.bench._workloads import tools

    kept = (tools.EMBEDDED, "JuiceFS")
    monkeypatch.setattr(tools, "_SYSTEMS", {s: f for s, f in tools._SYSTEMS.items() if s in kept})
    rows = quiet_run(tmp_path, "mount-tools", "--size-mib", "4", "--quick")
    systems = {r["system"] for r in rows}
    assert not [s for s in systems if "failed" in s], systems
    for tool in ("cp -a, then sync", "find", "du -s", "tar x, then sync", "git status"):
        assert {f"{tool}: local disk", f"{tool}: graben embedded"} <= systems, tool
    assert any(s.startswith("tar c, ") for s in systems)
    if (Path(sys.executable).parent / "juicefs").exists() or shutil.which("juicefs"):
        assert "rm -rf, then sync: graben embedded vs the faster peer" in systems
    assert all(r["value"] > 0 for r in rows)
    with open("/proc/self/mountinfo") as table:
        assert str(tmp_path) not in table.read()
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, check=False)
    assert left.stdout == b"", "a process outlived the run"
