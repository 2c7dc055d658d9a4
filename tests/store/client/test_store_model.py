"""A hypothesis state machine: the store against a plain dict model.

The model maps normalised file paths to bytes and keeps a set of directories;
every operation is applied to both and the outcomes (result or error class)
must agree.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from graben.store import Client, GrabenError, connect

NAMES = st.sampled_from(["a", "b", "c"])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))
DATA = st.one_of(st.binary(max_size=300), st.binary(min_size=1, max_size=4).map(lambda b: b * 200))


class Model:
    """Files and directories as the store should hold them."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {"/"}

    @staticmethod
    def parents(path: str) -> list[str]:
        parts = path.strip("/").split("/")
        return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]

    def kind(self, path: str) -> str | None:
        return "file" if path in self.files else "directory" if path in self.dirs else None

    def below(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        return [p for p in [*self.files, *self.dirs] if p.startswith(prefix)]

    def put(self, path: str, data: bytes) -> str:
        for parent in self.parents(path):
            if parent in self.files:
                return "NotADirectory"
        if path in self.dirs:
            return "IsADirectory"
        self.dirs.update(self.parents(path))
        self.files[path] = data
        return "ok"

    def rm(self, path: str, recursive: bool) -> str:
        if self.kind(path) is None:
            return (
                "NotADirectory" if any(p in self.files for p in self.parents(path)) else "NotFound"
            )
        inner = self.below(path)
        if inner and not recursive:
            return "DirectoryNotEmpty"
        for p in [path, *inner]:
            self.files.pop(p, None)
            self.dirs.discard(p)
        return "ok"

    def rename(self, src: str, dst: str) -> str:
        for parent in self.parents(src):
            if parent in self.files:
                return "NotADirectory"
        kind = self.kind(src)
        if kind is None:
            return "NotFound"
        if src == dst:
            return "ok"
        if dst.startswith(src + "/"):
            return "InvalidPath"
        if any(p in self.files for p in self.parents(dst)):
            return "NotADirectory"
        target = self.kind(dst)
        if target == "directory" and kind == "file":
            return "IsADirectory"
        if target == "file" and kind == "directory":
            return "NotADirectory"
        if target == "directory" and self.below(dst):
            return "DirectoryNotEmpty"
        moved = {p: dst + p[len(src) :] for p in [src, *self.below(src)]}
        self.files.pop(dst, None)
        self.dirs.discard(dst)
        self.dirs.update(self.parents(dst))
        for old, new in moved.items():
            if old in self.files:
                self.files[new] = self.files.pop(old)
            else:
                self.dirs.discard(old)
                self.dirs.add(new)
        return "ok"


def outcome(call: object) -> str:
    try:
        call()  # type: ignore[operator]
    except GrabenError as exc:
        return type(exc).__name__
    return "ok"


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.client: Client = connect(Path(self.tmp.name) / "s", chunk_size=4096)
        self.model = Model()

    def teardown(self) -> None:
        self.client.close()
        self.tmp.cleanup()

    @rule(path=PATHS, data=DATA)
    def put(self, path: str, data: bytes) -> None:
        assert outcome(lambda: self.client.put(path, data)) == self.model.put(path, data)

    @rule(path=PATHS, data=DATA)
    def write_file(self, path: str, data: bytes) -> None:
        def write() -> None:
            with self.client.open(path, "wb") as f:
                f.write(data[:100])
                f.write(data[100:])

        assert outcome(write) == self.model.put(path, data)

    @rule(path=PATHS)
    def mkdir(self, path: str) -> None:
        expected = "AlreadyExists" if self.model.kind(path) else "ok"
        if any(p in self.model.files for p in self.model.parents(path)):
            expected = "NotADirectory"
        elif expected == "ok":
            self.model.dirs.update([*self.model.parents(path), path])
        assert outcome(lambda: self.client.mkdir(path, parents=True)) == expected

    @rule(path=PATHS, recursive=st.booleans())
    def rm(self, path: str, recursive: bool) -> None:
        assert outcome(lambda: self.client.rm(path, recursive=recursive)) == self.model.rm(
            path, recursive
        )

    @rule(src=PATHS, dst=PATHS)
    def rename(self, src: str, dst: str) -> None:
        assert outcome(lambda: self.client.rename(src, dst)) == self.model.rename(src, dst)

    @precondition(lambda self: bool(self.model.files))
    @rule(data=st.data())
    def read_range(self, data: st.DataObject) -> None:
        path = data.draw(st.sampled_from(sorted(self.model.files)))
        content = self.model.files[path]
        start = data.draw(st.integers(0, len(content) + 2))
        end = data.draw(st.integers(start, len(content) + 5))
        assert self.client.get_range(path, start, end) == content[start:end]

    @invariant()
    def same_tree(self) -> None:
        seen: dict[str, bytes | None] = {}
        pending = ["/"]
        while pending:
            for info in self.client.ls(pending.pop()):
                seen[info.path] = None if info.is_dir else b""
                if info.is_dir:
                    pending.append(info.path)
        expected = dict.fromkeys(self.model.files, b"") | dict.fromkeys(self.model.dirs - {"/"})
        assert seen == expected
        for path, content in self.model.files.items():
            assert self.client.get(path) == content


TestStore = StoreMachine.TestCase
TestStore.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
