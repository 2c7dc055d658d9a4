"""Fixtures of the dataset tests: a dataset URL on each kind of storage."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest


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


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A dataset of ``N`` rows ``{"id": i}``: 11 Parquet shards of 20 rows, groups of 7."""
    from dataset_kit import write_rows

    return write_rows(str(tmp_path_factory.mktemp("ds") / "rows"))
