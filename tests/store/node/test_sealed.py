"""Chunk files encrypted at rest: what the disk holds is no plaintext, what is read back is
the bytes written, and a wrong or missing key, or a changed byte, is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cluster_kit import LocalCluster

from graben.store import IntegrityError, InvalidArgument, PermissionDenied, connect
from graben.store.node import Sealer, load_key
from graben.store.node._sealed import SALT, SEGMENT, TAG, plain_length, sealed_length

MARKER = b"GRABEN-PLAINTEXT-MARKER:"
KiB = 1 << 10


def _key(path: Path, key: bytes | None = None) -> Path:
    path.write_bytes((key or os.urandom(32)).hex().encode() + b"\n")
    path.chmod(0o600)
    return path


def _plaintext_in(root: Path) -> list[Path]:
    """Files under ``root`` holding the marker (what `grep -r` would find)."""
    return [p for p in root.rglob("*") if p.is_file() and MARKER in p.read_bytes()]


@pytest.mark.parametrize("length", [1, 15, 16, 17, 100_000, 1 << 20, (3 << 20) + 5])
def test_a_sealed_chunk_opens_to_its_bytes_and_nothing_else_does(length: int) -> None:
    sealer, data = Sealer(os.urandom(32)), os.urandom(length)
    with ThreadPoolExecutor(2) as pool:
        sealed = bytes(sealer.seal("a" * 64, memoryview(data), pool))
        assert len(sealed) == sealed_length(length) and plain_length(len(sealed)) == length
        assert data[:64] not in sealed
        into = bytearray(length)
        sealer.open("a" * 64, memoryview(sealed), memoryview(into), pool)
        assert into == data
    into = bytearray(length)
    sealer.open("a" * 64, memoryview(sealed), memoryview(into))
    assert into == data
    flipped = bytearray(sealed)
    flipped[len(sealed) // 2] ^= 1
    cut = sealed[: SALT + min(length, SEGMENT) + TAG] if length > SEGMENT else sealed[:-1]
    for wrong, name, key in (
        (flipped, "a" * 64, sealer),
        (sealed, "b" * 64, sealer),  # renamed to another chunk's id
        (sealed, "a" * 64, Sealer(os.urandom(32))),
    ):
        with pytest.raises(IntegrityError, match="authentication tag"):
            key.open(name, memoryview(bytes(wrong)), memoryview(bytearray(length)))
    with pytest.raises(IntegrityError):  # cut short: a length no chunk seals to, or a tag
        sealer.open("a" * 64, memoryview(cut), memoryview(bytearray(length)))
    assert sealer.seal("a" * 64, memoryview(data)) != sealer.seal("a" * 64, memoryview(data))


def test_an_embedded_store_keeps_no_plaintext_and_refuses_a_wrong_or_missing_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = _key(tmp_path / "key")
    monkeypatch.setenv("GRABEN_ENCRYPTION_KEY_FILE", str(key))
    data = MARKER * (300 * KiB // len(MARKER))
    with connect(tmp_path / "store") as store:
        store.put("/secret.bin", data)
        assert store.get("/secret.bin") == data
        assert store.fsck().problems == ()
    assert _plaintext_in(tmp_path / "store" / "chunks") == []
    monkeypatch.setenv("GRABEN_ENCRYPTION_KEY_FILE", str(_key(tmp_path / "other")))
    with pytest.raises(PermissionDenied, match="under another key"):
        connect(tmp_path / "store")
    monkeypatch.delenv("GRABEN_ENCRYPTION_KEY_FILE")
    with pytest.raises(PermissionDenied, match="give the store's key"):
        connect(tmp_path / "store")
    with connect(tmp_path / "plain") as store:
        store.put("/x", data)
    monkeypatch.setenv("GRABEN_ENCRYPTION_KEY_FILE", str(key))
    with pytest.raises(PermissionDenied, match="not encrypted"):
        connect(tmp_path / "plain")  # a key over plaintext already there: never mixed


def test_a_key_file_must_be_private_and_well_formed(tmp_path: Path) -> None:
    loose = _key(tmp_path / "loose")
    loose.chmod(0o644)
    with pytest.raises(PermissionDenied, match="chmod 600"):
        load_key(loose)
    short = tmp_path / "short"
    short.write_bytes(b"tooshort")
    short.chmod(0o600)
    with pytest.raises(InvalidArgument, match="32 bytes"):
        load_key(short)
    with pytest.raises(InvalidArgument, match="cannot read"):
        load_key(tmp_path / "missing")


def test_a_cluster_keeps_no_plaintext_on_its_nodes_and_a_node_without_the_key_stays_down(
    tmp_path: Path,
) -> None:
    key = _key(tmp_path / "key")
    data = MARKER * ((2 << 20) // len(MARKER))
    cluster = LocalCluster(tmp_path / "c", nodes=3, node_args=("--encryption-key-file", str(key)))
    try:
        with connect(cluster.url, chunk_size=256 * KiB) as client:
            client.put("/secret.bin", data)
            assert client.get("/secret.bin") == data
            assert client.fsck().problems == ()
        for i in range(3):
            assert cluster.chunk_files(i)  # the nodes hold the bytes...
            assert _plaintext_in(cluster.node_dir(i)) == []  # ...none of them readable
        cluster.kill(0)
    finally:
        cluster.close()
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "graben.store.cli",
            "node",
            "serve",
            "--data",
            str(tmp_path / "c" / "node0"),
            "--meta",
            "127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode == 1
    assert "encrypted chunk files: give the store's key" in started.stderr
