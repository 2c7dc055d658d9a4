"""CheckpointManager and ``graben ckpt``: steps, latest, retention, async saves, export."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint.api import CheckpointException

from graben.checkpoint import CheckpointManager, GrabenReader, GrabenWriter
from graben.store import InvalidArgument, connect, shared_client
from graben.store.cli._main import main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
ROOT = "graben:///runs/a"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GRABEN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRABEN_URL", raising=False)
    return tmp_path / "home"


def _state(step: int) -> dict[str, object]:
    return {"w": torch.full((64, 64), float(step)), "step": step}


def _blank() -> dict[str, object]:
    return {"w": torch.zeros(64, 64), "step": -1}


def test_latest_moves_and_retention_keeps_what_it_says(home: Path) -> None:
    with CheckpointManager(ROOT, keep_last=2, keep_every=3) as manager:
        assert manager.latest() is None and manager.load_latest(_blank()) is None
        for step in range(1, 7):
            manager.save(step, _state(step))
        assert [c.step for c in manager.list()] == [3, 5, 6]
        latest = manager.latest()
        assert latest is not None and latest.step == 6
        loaded = _blank()
        assert manager.load_latest(loaded) == 6
        assert torch.equal(loaded["w"], _state(6)["w"]) and loaded["step"] == 6  # type: ignore[arg-type]
        manager.load(3, loaded)
        assert loaded["step"] == 3


def test_ttl_lets_long_term_checkpoints_expire(home: Path) -> None:
    with CheckpointManager(ROOT, keep_last=1, keep_every=2, ttl=1e-6) as manager:
        for step in (2, 3, 4):
            manager.save(step, _state(step))
        assert [c.step for c in manager.list()] == [4]


def test_a_failed_save_moves_nothing(home: Path) -> None:
    with CheckpointManager(ROOT, keep_last=1) as manager:
        manager.save(1, _state(1))
        with pytest.raises(CheckpointException):  # a lambda cannot be pickled
            manager.save(2, {"w": torch.zeros(2), "bad": lambda: 0})
        assert [c.step for c in manager.list()] == [1]
        latest = manager.latest()
        assert latest is not None and latest.step == 1


def test_async_save_snapshots_at_the_call(home: Path) -> None:
    with CheckpointManager(ROOT, keep_last=3) as manager:
        state = _state(1)
        done = manager.save(1, state, async_=True)
        state["w"].add_(100)  # type: ignore[union-attr]  # training goes on at once
        info = done.result()  # type: ignore[union-attr]
        assert info.step == 1
        again = manager.save(2, state, async_=True)  # the same host buffers, reused
        manager.wait()
        assert again.done()  # type: ignore[union-attr]
        loaded = _blank()
        manager.load(1, loaded)
        assert torch.equal(loaded["w"], torch.full((64, 64), 1.0))  # type: ignore[arg-type]
        manager.load(2, loaded)
        assert torch.equal(loaded["w"], torch.full((64, 64), 101.0))  # type: ignore[arg-type]
        assert manager.latest().step == 2  # type: ignore[union-attr]


def test_dead_saves_staging_is_swept(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with connect(home) as client:
        client.mkdir("/runs/a/.step-000000000009.saving-dead", parents=True)
    monkeypatch.setattr("graben.checkpoint._manager.STALE_STAGING_S", 0.0)
    with CheckpointManager(ROOT) as manager:
        manager.save(10, _state(10))
    with connect(home) as client:
        assert [e.name for e in client.ls("/runs/a")] == ["latest", "step-000000000010"]


def test_cli_ls_lists_stock_dcp_checkpoints_too_without_torch(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``graben ckpt ls`` of stock ``dcp.save`` checkpoints said "no checkpoints"."""
    with CheckpointManager(ROOT, keep_last=None) as manager:
        manager.save(7, _state(7))
    for name in ("final", "best"):
        dcp.save(_state(1), storage_writer=GrabenWriter(f"{ROOT}/{name}"), no_dist=True)
    dcp.save(_state(2), storage_writer=GrabenWriter("graben:///alone"), no_dist=True)
    assert main(["ckpt", "ls", ROOT, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["url"], r["step"], r["latest"]) for r in rows] == [
        (f"{ROOT}/step-000000000007", 7, True),
        (f"{ROOT}/best", None, False),
        (f"{ROOT}/final", None, False),
    ]
    assert main(["ckpt", "ls", "graben:///alone"]) == 0  # a checkpoint named as a root
    assert capsys.readouterr().out.split()[-1] == "graben:///alone"
    code = (
        "import sys; from graben.store.cli._main import main; "
        f"code = main(['ckpt', 'ls', {ROOT!r}]); "
        "sys.exit(code or ('torch' in sys.modules and 'torch imported'))"
    )
    listed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert listed.returncode == 0, listed.stderr
    assert "step-000000000007" in listed.stdout


def test_cli_ls_rm_export(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with CheckpointManager(ROOT, keep_last=None) as manager:
        for step in (1, 2, 3):
            manager.save(step, _state(step))
    assert main(["ckpt", "ls", ROOT, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["latest"]) for r in rows] == [(1, False), (2, False), (3, True)]
    assert all(r["bytes"] > 64 * 64 * 4 for r in rows)

    step3 = f"{ROOT}/step-000000000003"
    assert main(["ckpt", "export", step3, str(tmp_path / "s.pt")]) == 0
    exported = torch.load(tmp_path / "s.pt", weights_only=True)
    assert torch.equal(exported["w"], _state(3)["w"]) and exported["step"] == 3
    assert (
        main(["ckpt", "export", f"{ROOT}/step-000000000003", str(tmp_path / "s.safetensors")]) == 0
    )
    assert torch.equal(load_file(str(tmp_path / "s.safetensors"))["w"], _state(3)["w"])

    assert main(["ckpt", "rm", "graben:///runs"]) == 1  # not a checkpoint: refused
    assert "not a checkpoint" in capsys.readouterr().err
    assert main(["ckpt", "rm", f"{ROOT}/step-000000000001"]) == 0
    assert main(["ckpt", "rm", ROOT, "--keep-last", "1"]) == 0
    with CheckpointManager(ROOT) as manager:
        assert [c.step for c in manager.list()] == [3]


def test_every_door_shares_one_client_per_store(home: Path) -> None:
    """A job that makes a GrabenWriter per step must not open a client per step, nor
    hold another for the dataset it reads through fsspec."""
    first, second = GrabenWriter("graben:///x/1"), GrabenWriter("graben:///x/2")
    assert first.client is second.client is GrabenReader("graben:///x/1").client
    assert fsspec.filesystem("graben").client is first.client is shared_client()
    assert CheckpointManager("graben:///runs").client is first.client
    with connect(home) as mine:
        assert GrabenWriter("graben:///x/3", client=mine).client is mine


def test_old_steps_take_the_archive_class_and_load_back_once_converted(cluster_url: str) -> None:
    from cluster_kit import eventually

    root = f"{cluster_url}/runs/archived-{time.time_ns()}"
    big = {"w": torch.randn(512, 512), "step": 0}  # 1 MiB: kept on the nodes, not inline
    with CheckpointManager(root, keep_last=3, archive_class="ec:2+1") as manager:
        for step in (1, 2, 3):
            manager.save(step, {**big, "step": step})
        client = manager.client
        path = f"{manager.root}/step-{{:012d}}"
        assert [client.storage_class(path.format(s)).name for s in (1, 2, 3)] == [
            "ec:2+1",
            "ec:2+1",
            "",
        ]
        file = next(e.path for e in client.ls(path.format(1)) if not e.is_dir and e.size > 1 << 19)
        eventually(
            lambda: client.storage_class(file).converted == client.storage_class(file).chunks
        )
        loaded = {"w": torch.zeros(512, 512), "step": -1}
        manager.load(1, loaded)
        assert torch.equal(loaded["w"], big["w"]) and loaded["step"] == 1  # type: ignore[arg-type]


def test_a_wrong_archive_class_is_refused_when_the_manager_is_made(home: Path) -> None:
    with pytest.raises(InvalidArgument, match="unknown storage class"):
        CheckpointManager(ROOT, archive_class="cold")
    with pytest.raises(InvalidArgument, match="archive_after"):
        CheckpointManager(ROOT, archive_class="ec:2+1", archive_after=0)
