"""A cluster whose metadata service and data nodes are each on a host of their
own (network namespaces), used from another host: what crosses a network
crosses one here."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns_kit import Hosts, needs_netns

from graben.store import connect

pytestmark = needs_netns


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    kit = Hosts(4)
    try:
        yield kit
    finally:
        kit.close()


def test_a_cluster_across_hosts_serves_a_client_on_another(hosts: Hosts, tmp_path: Path) -> None:
    engine = f"sqlite:///{tmp_path / 'meta.db'}"
    meta = f"{hosts.address(0)}:7100"
    hosts.graben(0, "meta", "serve", "--init", "--engine", engine, "--listen", meta)
    for i in (1, 2, 3):
        _, address = hosts.graben(
            i,
            *("node", "serve", "--data", str(tmp_path / f"node{i}"), "--meta", meta),
            *("--rack", f"rack{i}", "--listen", f"{hosts.address(i)}:7200"),
        )
        assert address == f"{hosts.address(i)}:7200"
    data = os.urandom(3 << 20)
    with connect(f"graben://{meta}", chunk_size=1 << 20) as client:
        deadline = time.monotonic() + 30
        while sum(n.alive for n in client.health().nodes) < 3:
            assert time.monotonic() < deadline, "the nodes never joined across the bridge"
            time.sleep(0.2)
        client.put("/across/hosts.bin", data)
        assert client.get("/across/hosts.bin") == data
        addresses = {n.address for n in client.health().nodes}
        assert addresses == {f"{hosts.address(i)}:7200" for i in (1, 2, 3)}
        hosts.cut(2)  # one host's cable pulled: its copies are out of reach
        assert client.get("/across/hosts.bin") == data  # read from the other two
        hosts.cut(2, down=False)


def test_servers_bound_to_every_interface_are_dialled_at_their_advertised_address(
    hosts: Hosts, tmp_path: Path
) -> None:
    engine = f"sqlite:///{tmp_path / 'meta.db'}"
    _, meta = hosts.graben(
        0,
        *("meta", "serve", "--init", "--engine", engine),
        *("--listen", "0.0.0.0:7100", "--advertise", f"{hosts.address(0)}:7100"),
    )
    assert meta == f"{hosts.address(0)}:7100"
    for i in (1, 2, 3):  # no port: each takes 7200, the first free one on its host
        _, address = hosts.graben(
            i,
            *("node", "serve", "--data", str(tmp_path / f"node{i}"), "--meta", meta),
            *("--rack", f"rack{i}", "--listen", "0.0.0.0", "--advertise", hosts.address(i)),
        )
        assert address == f"{hosts.address(i)}:7200"
    data = os.urandom(3 << 20)
    with connect(f"graben://{meta}", chunk_size=1 << 20) as client:
        deadline = time.monotonic() + 30
        while sum(n.alive for n in client.health().nodes) < 3:
            assert time.monotonic() < deadline, "the nodes never joined across the bridge"
            time.sleep(0.2)
        assert {n.address for n in client.health().nodes} == {
            f"{hosts.address(i)}:7200" for i in (1, 2, 3)
        }
        client.put("/advertised.bin", data)
        assert client.get("/advertised.bin") == data
