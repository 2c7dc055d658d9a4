"""Stock tools on a mount: fsspec's conformance suite, torch.save, DCP's FileSystemWriter, fio.

Each runs on a mount of an embedded store and of the session's 3-node cluster;
the last test kills a mount's daemon and mounts again.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import fsspec
import pytest
import torch
import torch.distributed.checkpoint as dcp
from fsspec.implementations.local import LocalFileSystem
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)
from fuse_kit import needs_fuse, unmount_and_wait

from graben.fuse import MountOptions, mount
from graben.store import Client

pytestmark = [
    needs_fuse,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]


# -- fsspec's own suite, with its LocalFileSystem inside the mount ------------------


class MountFixtures(AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture
    def fs(self) -> LocalFileSystem:
        return LocalFileSystem(auto_mkdir=True)

    @pytest.fixture
    def fs_join(self):  # type: ignore[no-untyped-def]
        return os.path.join

    @pytest.fixture
    def fs_path(self, here: Path) -> str:
        return str(here)


class TestMountCopy(MountFixtures, AbstractCopyTests):  # type: ignore[misc]
    pass


class TestMountGet(MountFixtures, AbstractGetTests):  # type: ignore[misc]
    pass


class TestMountPut(MountFixtures, AbstractPutTests):  # type: ignore[misc]
    pass


class TestMountPipe(MountFixtures, AbstractPipeTests):  # type: ignore[misc]
    pass


class TestMountOpen(MountFixtures, AbstractOpenTests):  # type: ignore[misc]
    pass


# -- torch and DCP ----------------------------------------------------------------


def _state(total_bytes: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    per = total_bytes // 8 // 4  # eight float32 tensors
    return {f"layer{i}.weight": torch.randn(per, generator=gen) for i in range(8)}


def test_torch_save_and_load_of_a_gib(here: Path, direct: Client) -> None:
    state = _state(1 << 30, seed=1)
    torch.save(state, here / "model.pt")
    size = (here / "model.pt").stat().st_size
    assert size > 1 << 30
    assert direct.stat(f"/{here.name}/model.pt").size == size
    loaded = torch.load(here / "model.pt", weights_only=True)
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_dcp_file_system_writer_and_reader_on_the_mount(here: Path) -> None:
    state = _state(64 << 20, seed=2)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(here / "ckpt")))
    assert (here / "ckpt" / ".metadata").exists()
    target = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(target, storage_reader=dcp.FileSystemReader(str(here / "ckpt")))
    assert all(torch.equal(target[k], state[k]) for k in state)


@pytest.mark.skipif(shutil.which("fio") is None, reason="needs fio (make test installs it)")
def test_fio_random_writes_verify(here: Path) -> None:
    done = subprocess.run(
        [
            "fio",
            "--name=verify",
            f"--filename={here / 'fio.bin'}",
            "--size=64m",
            "--rw=randwrite",
            "--bs=4k",
            "--ioengine=psync",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=terse",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verify" not in done.stderr.lower()


# -- the daemon dies ------------------------------------------------------------------


def test_a_killed_daemon_is_cleaned_up_by_the_next_mount(store_url: str, tmp_path: Path) -> None:
    point, name = tmp_path / "mnt", f"kill-{uuid.uuid4().hex[:6]}"
    point.mkdir()
    options = MountOptions(spool_dir=tmp_path / "spool")
    pid = mount(store_url, point, options)
    assert pid is not None
    try:
        (point / name).write_bytes(b"committed before the kill")
        os.kill(pid, signal.SIGKILL)
        assert _error_once_dead(point) in (errno.ENOTCONN, errno.ECONNABORTED)
        pid = mount(store_url, point, options)
        assert pid is not None
        assert (point / name).read_bytes() == b"committed before the kill"
        os.unlink(point / name)
    finally:
        unmount_and_wait(point, pid)
    assert not os.path.ismount(point)
    assert fsspec.filesystem("file").exists(str(point))


def _error_once_dead(point: Path) -> int | None:
    """The errno a mount point answers once its daemon is gone (``None``: it never died)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.stat(point)
        except OSError as exc:
            return exc.errno
        time.sleep(0.05)
    return None
