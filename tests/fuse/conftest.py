"""Fixtures of the FUSE tests: each test module mounts each kind of store once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from graben.store import Client, connect


@pytest.fixture(scope="module", params=["embedded", "cluster"])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store of each kind for the FUSE tests: an embedded directory, the session's cluster."""
    if request.param == "embedded":
        return str(tmp_path_factory.mktemp("fuse-store"))
    url: str = request.getfixturevalue("cluster_url")
    return url


@pytest.fixture(scope="module")
def mount_point(store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``store_url`` mounted for the module (unmounted, daemon gone, after it)."""
    from fuse_kit import mounted

    with mounted(store_url, tmp_path_factory.mktemp("fuse")) as point:
        yield point


@pytest.fixture(scope="module")
def direct(store_url: str) -> Iterator[Client]:
    """The mounted store through the client, to check what the mount did."""
    with connect(store_url) as client:
        yield client


@pytest.fixture
def here(mount_point: Path, direct: Client) -> Iterator[Path]:
    """A fresh directory in the mount for one test, removed after it."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    (mount_point / name).mkdir()
    yield mount_point / name
    direct.rm(f"/{name}", recursive=True)
