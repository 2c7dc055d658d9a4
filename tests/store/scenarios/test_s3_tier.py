"""The S3 tier on a real cluster and moto's real S3 server: chunks of class ``s3`` moved to
the bucket in the background, read through the nodes into their caches, served from the
caches while the endpoint is down, and everything again once it restarts."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import LocalCluster, eventually
from ranks_kit import free_port

from graben.store import Client, GrabenError, InvalidArgument, connect

KiB = 1 << 10
BUCKET = "tier"


class Endpoint:
    """moto's S3 server on one port, stopped and started again like a restarted endpoint
    (moto keeps its buckets per process, so what was stored is there after)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None
        self.start()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        assert self._server is not None
        self._server.stop()
        self._server = None

    def objects(self) -> list[str]:
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.url, region_name="eu-west-1")
        return [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]


@pytest.fixture
def tiered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[LocalCluster, Endpoint]]:
    pytest.importorskip("obstore")
    endpoint = Endpoint()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": endpoint.url,
    }.items():
        monkeypatch.setenv(name, value)
    import boto3

    boto3.client("s3", endpoint_url=endpoint.url).create_bucket(
        Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
    )
    tier = ("--s3-tier", f"s3://{BUCKET}/graben")
    cluster = LocalCluster(
        tmp_path, nodes=3, timeout=4.0, repair=0.3, meta_args=tier, node_args=tier
    )
    try:
        yield cluster, endpoint
    finally:
        cluster.close()
        if endpoint._server is not None:
            endpoint.stop()


def _moved(client: Client, path: str) -> bool:
    state = client.storage_class(path)
    return state.chunks > 0 and state.converted == state.chunks


def _node_bytes(cluster: LocalCluster) -> int:
    return sum(p.stat().st_size for i in range(3) for p in cluster.chunk_files(i))


def test_s3_class_moves_chunks_to_the_bucket_reads_through_and_survives_an_endpoint_restart(
    tiered: tuple[LocalCluster, Endpoint],
) -> None:
    cluster, endpoint = tiered
    cold, colder = os.urandom(3 * 256 * KiB), os.urandom(2 * 256 * KiB)
    with connect(cluster.url, chunk_size=256 * KiB) as client:
        client.put("/cold/a", cold)
        client.put("/cold/b", colder)
        before = _node_bytes(cluster)
        assert client.set_class("/cold", "s3") == "s3"
        eventually(lambda: _moved(client, "/cold/a") and _moved(client, "/cold/b"))
        assert len(endpoint.objects()) == 5
        # The copies are gone from the nodes' disks once the stripes are recorded.
        eventually(lambda: _node_bytes(cluster) <= before - 3 * len(cold + colder))
        assert client.get("/cold/a") == cold  # read through two nodes, into their caches
        assert client.layout("/cold/a").stripes == {}  # readers see nodes, not the bucket
    endpoint.stop()
    try:
        with connect(cluster.url, timeout=60) as client:
            assert client.get("/cold/a") == cold  # the nodes' caches serve it
            started = time.monotonic()
            with pytest.raises(GrabenError, match="could not fetch chunk") as failed:
                client.get("/cold/b")  # never read: only the bucket has it
            assert time.monotonic() - started < 60
            assert f"s3://{BUCKET}/graben" in str(failed.value)
            # A class set while the bucket is away waits; the file stays readable.
            data = os.urandom(200 * KiB)
            client.put("/later/c", data)
            client.set_class("/later", "s3")
            time.sleep(2)
            assert client.storage_class("/later/c").converted == 0
            assert client.get("/later/c") == data
    finally:
        endpoint.start()
    with connect(cluster.url) as client:
        assert client.get("/cold/b") == colder
        eventually(lambda: _moved(client, "/later/c"))
        assert client.get("/later/c") == data
        report = client.fsck()
        assert [p for p in report.problems if p.kind != "orphan"] == []


def test_a_store_without_an_s3_tier_refuses_the_class(tmp_path: Path) -> None:
    with connect(str(tmp_path / "store")) as client:
        client.mkdir("/d")
        with pytest.raises(InvalidArgument, match="no S3 tier"):
            client.set_class("/d", "s3")
        assert client.storage_class("/d").name == ""
