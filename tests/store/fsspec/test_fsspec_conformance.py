"""fsspec's own conformance suite (``fsspec.tests.abstract``) on ``graben://``.

Run against an embedded store, the session's 3-node cluster, and a 3-node
cluster whose metadata lives in PostgreSQL; nothing is skipped (but the
last where PostgreSQL is missing, saying so).
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

from graben.store import GrabenFileSystem


@pytest.fixture(scope="module", params=["embedded", "cluster", "cluster on PostgreSQL"])
def graben_fs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GrabenFileSystem]:
    """A ``GrabenFileSystem`` reached the way users reach it: through a URL."""
    if request.param == "embedded":
        root: Path = tmp_path_factory.mktemp("fsspec-embedded")
        fs = GrabenFileSystem(url=str(root), skip_instance_cache=True)
    else:
        name = "cluster_url" if request.param == "cluster" else "pg_cluster"
        url = request.getfixturevalue(name)
        fs, _ = fsspec.core.url_to_fs(f"{url}/", skip_instance_cache=True)
        assert isinstance(fs, GrabenFileSystem)
    yield fs
    fs.client.close()


class GrabenFixtures(AbstractFixtures):  # type: ignore[misc]
    @pytest.fixture
    def fs(self, graben_fs: GrabenFileSystem) -> GrabenFileSystem:
        return graben_fs

    @pytest.fixture
    def fs_join(self):  # type: ignore[no-untyped-def]
        return posixpath.join

    @pytest.fixture
    def fs_path(self, graben_fs: GrabenFileSystem) -> Iterator[str]:
        path = f"/conformance-{uuid.uuid4().hex[:8]}"
        graben_fs.mkdir(path)
        yield path
        graben_fs.rm(path, recursive=True)


class TestGrabenCopy(GrabenFixtures, AbstractCopyTests):  # type: ignore[misc]
    pass


class TestGrabenGet(GrabenFixtures, AbstractGetTests):  # type: ignore[misc]
    pass


class TestGrabenPut(GrabenFixtures, AbstractPutTests):  # type: ignore[misc]
    pass


class TestGrabenPipe(GrabenFixtures, AbstractPipeTests):  # type: ignore[misc]
    pass


class TestGrabenOpen(GrabenFixtures, AbstractOpenTests):  # type: ignore[misc]
    pass
