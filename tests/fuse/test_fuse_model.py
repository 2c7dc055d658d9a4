"""The mount against the kernel's own filesystem: the same random operations, the same outcomes.

A hypothesis state machine applies each operation to a directory in a real
mount and to a local temporary directory, and checks that both succeed with
the same result or fail with the same errno; after every step the two trees
must hold the same names, kinds and bytes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fuse_kit import mounted, needs_fuse
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

pytestmark = needs_fuse
# Mostly names that exist or can, so that most steps do something; a few deeper ones.
NAMES = st.sampled_from(["a", "b", "c", "a", "b", "d", "d/a", "d/b", "e", "e/a"])
DATA = st.binary(max_size=3000)
OFFSETS = st.integers(min_value=0, max_value=5000)


@pytest.fixture(scope="module")
def mount_point(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("fuse-model")
    with mounted(str(where / "store"), where) as point:
        yield point


def _outcome(fn: Callable[[Path], Any], root: Path) -> tuple[str, Any]:
    try:
        return "ok", fn(root)
    except OSError as exc:
        return "error", exc.errno


def _tree(root: Path) -> dict[str, bytes | None]:
    found: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found[os.path.relpath(os.path.join(dirpath, name), root)] = None
        for name in filenames:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, root)] = Path(path).read_bytes()
    return found


class MountMatchesLocal(RuleBasedStateMachine):
    point: Path

    def __init__(self) -> None:
        super().__init__()
        self.mounted = self.point / f"m-{uuid.uuid4().hex[:8]}"
        self.mounted.mkdir()
        self.local = Path(tempfile.mkdtemp(prefix="graben-model-"))
        for root in (self.mounted, self.local):
            (root / "d").mkdir()
            (root / "a").write_bytes(b"start")

    def both(self, fn: Callable[[Path], Any]) -> None:
        on_mount, on_local = _outcome(fn, self.mounted), _outcome(fn, self.local)
        assert on_mount == on_local

    @rule(name=NAMES, data=DATA)
    def write(self, name: str, data: bytes) -> None:
        self.both(lambda root: (root / name).write_bytes(data))

    @rule(name=NAMES, data=DATA)
    def append(self, name: str, data: bytes) -> None:
        def append(root: Path) -> None:
            with open(root / name, "ab") as f:
                f.write(data)

        self.both(append)

    @rule(name=NAMES, data=DATA, offset=OFFSETS)
    def write_at(self, name: str, data: bytes, offset: int) -> None:
        def write_at(root: Path) -> int:
            fd = os.open(root / name, os.O_WRONLY)
            try:
                return os.pwrite(fd, data, offset)
            finally:
                os.close(fd)

        self.both(write_at)

    @rule(name=NAMES, size=OFFSETS)
    def truncate(self, name: str, size: int) -> None:
        self.both(lambda root: os.truncate(root / name, size))

    @rule(name=NAMES, offset=OFFSETS, size=st.integers(0, 4000))
    def read_at(self, name: str, offset: int, size: int) -> None:
        def read_at(root: Path) -> bytes:
            fd = os.open(root / name, os.O_RDONLY)
            try:
                return os.pread(fd, size, offset)
            finally:
                os.close(fd)

        self.both(read_at)

    @rule(name=NAMES)
    def mkdir(self, name: str) -> None:
        self.both(lambda root: (root / name).mkdir())

    @rule(name=NAMES)
    def rmdir(self, name: str) -> None:
        self.both(lambda root: (root / name).rmdir())

    @rule(name=NAMES)
    def unlink(self, name: str) -> None:
        self.both(lambda root: (root / name).unlink())

    @rule(src=NAMES, dst=NAMES)
    def rename(self, src: str, dst: str) -> None:
        self.both(lambda root: os.rename(root / src, root / dst))

    @rule(name=NAMES)
    def stat(self, name: str) -> None:
        def kind_and_size(root: Path) -> tuple[bool, int]:
            st = (root / name).stat()
            return os.path.isdir(root / name), 0 if os.path.isdir(root / name) else st.st_size

        self.both(kind_and_size)

    @invariant()
    def same_tree(self) -> None:
        assert _tree(self.mounted) == _tree(self.local)

    def teardown(self) -> None:
        shutil.rmtree(self.mounted)
        shutil.rmtree(self.local)


def test_the_mount_behaves_like_a_local_directory(mount_point: Path) -> None:
    MountMatchesLocal.point = mount_point
    MountMatchesLocal.TestCase.settings = settings(
        max_examples=50,
        stateful_step_count=20,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    MountMatchesLocal.TestCase().runTest()
