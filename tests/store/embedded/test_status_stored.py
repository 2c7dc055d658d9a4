"""An embedded store's status counts the bytes its own files take, apart from the disk."""

from __future__ import annotations

import os
from pathlib import Path

from graben.store import connect

MIB = 1 << 20


def test_an_embedded_store_counts_its_own_bytes(tmp_path: Path) -> None:
    with connect(str(tmp_path / "s")) as client:
        client.put("/a", os.urandom(2 * MIB))
        [node] = client.health().nodes
    assert 2 * MIB <= node.stored < 3 * MIB, node  # its chunk and its metadata, no more
    assert 0 < node.free < node.total
