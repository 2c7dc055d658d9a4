"""``graben ckpt`` on wrong input: one line saying what is wrong and what to do, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graben.checkpoint import CheckpointManager
from graben.store import connect
from graben.store.cli._main import main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
ROOT = "graben:///runs/a"
STEP = f"{ROOT}/step-000000000200"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A default store with a root of two checkpoints, a plain file and a plain directory."""
    monkeypatch.setenv("GRABEN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GRABEN_URL", raising=False)
    with CheckpointManager(ROOT, keep_last=None) as manager:
        for step in (100, 200):
            manager.save(step, {"w": torch.full((8,), float(step))})
    with connect(tmp_path / "home") as client:
        client.put("/runs/notes.txt", b"not a checkpoint")
        client.mkdir("/runs/empty")
    return tmp_path / "home"


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    """Run ``graben argv``: exit 1, nothing on stdout, one line on stderr naming ``words``."""
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("graben: ") and err.count("\n") == 1, err
    line = " ".join(err.split())
    for word in words:
        assert word in line, (word, line)
    return line


def test_export_of_a_root_names_its_steps(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.pt"
    _fails(capsys, ["ckpt", "export", ROOT, str(out)], "checkpoint root", STEP, "ckpt ls")
    assert not out.exists()


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("graben:///runs/nope", ["no such checkpoint", "/runs/nope"]),
        ("graben:///runs/notes.txt", ["not a checkpoint", "a file"]),
        ("graben:///runs/empty", ["not a checkpoint", "no .metadata"]),
        ("s3://bucket/ckpt", ["graben://", "s3://bucket/ckpt"]),
    ],
)
def test_export_of_what_is_no_checkpoint(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, words: list[str]
) -> None:
    _fails(capsys, ["ckpt", "export", url, str(tmp_path / "s.pt")], *words)


def test_export_to_a_missing_directory_or_a_directory(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fails(capsys, ["ckpt", "export", STEP, str(tmp_path / "no" / "s.pt")], "no such", "no")
    _fails(capsys, ["ckpt", "export", STEP, str(tmp_path)], "is a directory")
    assert main(["ckpt", "export", STEP, str(tmp_path / "s.pt")]) == 0  # and the right way works
    assert torch.load(tmp_path / "s.pt", weights_only=True)["w"][0] == 200.0


def test_export_of_a_damaged_checkpoint(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with connect(home) as client:
        client.put("/runs/a/step-000000000200/.metadata", b"\x80\x04garbage")
    _fails(capsys, ["ckpt", "export", STEP, str(tmp_path / "s.pt")], "cannot read", STEP)
    assert not (tmp_path / "s.pt").exists()


def test_ls_of_a_missing_root_fails(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(capsys, ["ckpt", "ls", "graben:///runs/b"], "no such checkpoint root", "/runs/b")
    _fails(capsys, ["ckpt", "ls", "graben:///runs/notes.txt"], "not a checkpoint root", "a file")


def test_ls_of_an_empty_root_says_so(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ckpt", "ls", "graben:///runs/empty"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "no checkpoints" in err
    assert main(["ckpt", "ls", "graben:///runs/empty", "--json"]) == 0
    assert capsys.readouterr().out == "[]\n"


def test_rm_of_a_root_or_nothing_is_refused(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fails(capsys, ["ckpt", "rm", ROOT], "checkpoint root", STEP, "--keep-last")
    _fails(capsys, ["ckpt", "rm", "graben:///runs/nope"], "no such checkpoint")
    retention = ["ckpt", "rm", "graben:///runs/b", "--keep-last", "1"]
    _fails(capsys, retention, "no such checkpoint root")
    with CheckpointManager(ROOT) as manager:
        assert [c.step for c in manager.list()] == [100, 200]  # nothing was lost


def test_ls_of_a_folder_of_jobs_names_the_jobs(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder holding several jobs has no checkpoints of its own: ``ckpt ls`` says so,
    and names the jobs below it to list instead."""
    with CheckpointManager("graben:///runs/b", keep_last=None) as manager:
        manager.save(1, {"w": torch.zeros(2)})
    assert main(["ckpt", "ls", "graben:///runs"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "no checkpoints in graben:///runs;" in err
    assert "jobs below it: graben:///runs/a, graben:///runs/b" in err, err
    assert "empty" not in err
    assert main(["ckpt", "ls", "graben:///runs", "--json"]) == 0
    assert capsys.readouterr().out == "[]\n"
