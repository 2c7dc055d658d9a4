"""Shared fixtures: stores to run the conformance tests against."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from graben.store import Client, connect
from graben.store.cli._cluster import local_cluster, make_secret_file

SMALL_CHUNK = 64 * 1024
"""Chunk size for tests that want many chunks from few bytes."""


def pytest_configure(config: pytest.Config) -> None:
    """One cluster secret for the session: every server and client the tests start
    finds it in ``$GRABEN_SECRET_FILE``, as a user's shell would provide it."""
    home = Path(tempfile.mkdtemp(prefix="graben-secret-"))
    config.stash[_SECRET_HOME] = home
    os.environ["GRABEN_SECRET_FILE"] = str(make_secret_file(home / "secret"))


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(config.stash[_SECRET_HOME], ignore_errors=True)


_SECRET_HOME = pytest.StashKey[Path]()


def _chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "chunks").glob("??/??/*") if p.is_file())


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """An empty directory for an embedded store."""
    return tmp_path / "store"


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real 3-node cluster on loopback (separate processes), for the whole session."""
    secret = Path(os.environ["GRABEN_SECRET_FILE"])
    with local_cluster(tmp_path_factory.mktemp("cluster"), nodes=3, secret_file=secret) as url:
        yield url


@pytest.fixture(params=["embedded", "cluster"])
def client(request: pytest.FixtureRequest, store_dir: Path) -> Iterator[Client]:
    """A sync client on each kind of store: the conformance tests run on both."""
    if request.param == "embedded":
        with connect(store_dir, chunk_size=SMALL_CHUNK) as c:
            yield c
        return
    url = request.getfixturevalue("cluster_url")
    with connect(url, chunk_size=SMALL_CHUNK) as c:
        for entry in c.ls("/"):  # each test starts from an empty namespace
            c.rm(entry.path, recursive=True)
        yield c


@pytest.fixture
def chunk_files(store_dir: Path) -> Callable[[], list[Path]]:
    """A function listing the embedded store's chunk files."""
    return lambda: _chunk_files(store_dir)


@pytest.fixture(autouse=True)
def _close_shared_checkpoint_clients() -> Iterator[None]:
    """The checkpoint door keeps one client per store per process; tests use many stores."""
    yield
    _storage = sys.modules.get("graben.checkpoint._storage")
    if _storage is None:  # not imported: nothing to close (and no torch to import)
        return
    with _storage._shared_lock:
        clients = list(_storage._shared_clients.values())
        _storage._shared_clients.clear()
    for client in clients:
        client.close()


# -- FUSE: each test module mounts each kind of store once ---------------------------


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


# -- datasets: a URL on each kind of storage ------------------------------------------


@pytest.fixture(scope="session")
def s3_options() -> Iterator[dict[str, Any]]:
    """moto's real S3 server on loopback, with a bucket; the fsspec options to reach it."""
    import fsspec
    from moto.server import ThreadedMotoServer
    from ranks_kit import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    options = {
        "key": "test",
        "secret": "test",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "eu-west-1"},
        "skip_instance_cache": True,
    }
    fsspec.filesystem("s3", **options).mkdir("data")
    try:
        yield options
    finally:
        server.stop()


@pytest.fixture(params=["local", "graben", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, dict[str, Any] | None]:
    """A dataset URL on each kind of storage, and its fsspec options."""
    if request.param == "local":
        return str(tmp_path / "ds"), None
    if request.param == "graben":
        url: str = request.getfixturevalue("cluster_url")
        return f"{url}/datasets/{tmp_path.name}", None
    return f"s3://data/{tmp_path.name}", request.getfixturevalue("s3_options")
