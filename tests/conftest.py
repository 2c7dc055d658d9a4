"""Session-wide fixtures: the cluster secret, the session's cluster, a client of each kind.

The fixtures of one door or layer are in the conftest.py of its folder
(``store/``, ``fuse/``, ``dataloader/``); the kits (``cluster_kit``,
``fuse_kit``, ``netns_kit``, ``ranks_kit``, ``store_kit``) are here, importable
from every test (``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import three_nodes
from store_kit import SMALL_CHUNK

from graben.store import Client, clear_shared_clients, connect
from graben.store.local import make_secret_file


def pytest_configure(config: pytest.Config) -> None:
    """One cluster secret for the session: every server and client the tests start
    finds it in ``$GRABEN_SECRET_FILE``, as a user's shell would provide it; servers
    serve no metrics unless asked (``$GRABEN_METRICS``)."""
    home = Path(tempfile.mkdtemp(prefix="graben-secret-"))
    config.stash[_SECRET_HOME] = home
    os.environ["GRABEN_SECRET_FILE"] = str(make_secret_file(home / "secret"))
    os.environ["XDG_CACHE_HOME"] = str(home / "cache")  # dataset caches: never the user's own
    # Servers serve metrics by default on their own port + 1000: a port no test was given
    # (another test may hold it). Here none unless a test asks (test_metrics.py), which
    # saves every server's start its HTTP thread; default_ports.py and the README's
    # cluster session (in namespaces of their own) try the default itself.
    os.environ.setdefault("GRABEN_METRICS", "off")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(config.stash[_SECRET_HOME], ignore_errors=True)


_SECRET_HOME = pytest.StashKey[Path]()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """An empty directory for an embedded store."""
    return tmp_path / "store"


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real 3-node cluster on loopback (separate processes), for the whole session.

    A module whose tests fsck the whole cluster overrides it with a cluster of its
    own (``cluster_kit.three_nodes``): fsck re-reads every chunk, and this one holds
    what every other module wrote until the collection grace passes."""
    with three_nodes(tmp_path_factory) as url:
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


@pytest.fixture(autouse=True)
def _close_shared_clients() -> Iterator[None]:
    """The doors share one client per store per process; tests use many stores."""
    yield
    clear_shared_clients()
