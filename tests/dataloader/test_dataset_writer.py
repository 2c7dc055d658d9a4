"""write_dataset: shards plus a manifest, on a local path, a graben cluster and S3 (moto)."""

from __future__ import annotations

import io
import struct
from typing import Any

import crc32c
import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graben.dataloader import Manifest, read_manifest, write_dataset
from graben.store import InvalidArgument


def _shard_bytes(url: str, options: dict[str, Any] | None, name: str) -> bytes:
    fs, root = fsspec.core.url_to_fs(url, **(options or {}))
    data: bytes = fs.cat_file(f"{root}/{name}")
    return data


def _check_shards(url: str, options: dict[str, Any] | None, manifest: Manifest) -> list[bytes]:
    """Every shard is there with the size and crc32c the manifest says."""
    found = []
    for shard in manifest.shards:
        data = _shard_bytes(url, options, shard.name)
        assert (len(data), crc32c.crc32c(data)) == (shard.size, shard.crc32c)
        found.append(data)
    return found


def test_a_table_becomes_parquet_shards_in_row_groups(where: tuple[str, Any]) -> None:
    url, options = where
    table = pa.table({"id": list(range(2500)), "text": [f"row {i}" for i in range(2500)]})
    manifest = write_dataset(
        url, table, rows_per_shard=1000, rows_per_group=300, storage_options=options
    )
    assert read_manifest(url, storage_options=options) == manifest
    assert (manifest.kind, manifest.columns, manifest.samples) == ("parquet", ("id", "text"), 2500)
    assert [s.samples for s in manifest.shards] == [1000, 1000, 500]
    assert manifest.shards[0].groups == (300, 300, 300, 100)
    shards = _check_shards(url, options, manifest)
    back = pa.concat_tables(pq.read_table(io.BytesIO(data)) for data in shards)
    assert back.equals(table)


def test_payload_columns_are_stored_plain_and_labels_by_dictionary(tmp_path: Any) -> None:
    """Binary payloads, nearly all distinct, are not dictionary-encoded (a dictionary of
    them made reads three times slower); a column of labels still is."""
    table = pa.table(
        {
            "id": list(range(300)),
            "label": ["cat", "dog", "eel"] * 100,
            "data": [i.to_bytes(4, "big") * 256 for i in range(300)],
        }
    )
    manifest = write_dataset(str(tmp_path / "ds"), table, rows_per_shard=300, compression=None)
    (data,) = _check_shards(str(tmp_path / "ds"), None, manifest)
    group = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(3)}
    assert "RLE_DICTIONARY" not in encodings["data"]
    assert "RLE_DICTIONARY" in encodings["label"]
    assert pq.read_table(io.BytesIO(data)).equals(table)


def test_dict_rows_and_bytes_samples(tmp_path: Any) -> None:
    rows = [{"x": i, "y": float(i) / 2} for i in range(25)]
    manifest = write_dataset(str(tmp_path / "rows"), iter(rows), rows_per_shard=10)
    assert [s.samples for s in manifest.shards] == [10, 10, 5]
    shards = _check_shards(str(tmp_path / "rows"), None, manifest)
    assert pa.concat_tables(pq.read_table(io.BytesIO(d)) for d in shards).to_pylist() == rows

    samples = [bytes([i]) * i for i in range(30)]  # the empty sample too
    manifest = write_dataset(str(tmp_path / "blobs"), samples, rows_per_shard=8)
    assert (manifest.kind, manifest.samples, len(manifest.shards)) == ("records", 30, 4)
    back = []
    for data in _check_shards(str(tmp_path / "blobs"), None, manifest):
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack_from("<Q", data, pos)
            back.append(data[pos + 8 : pos + 8 + length])
            pos += 8 + length
    assert back == samples


def test_bad_input_is_refused_before_anything_is_written(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="no samples"):
        write_dataset(str(tmp_path / "empty"), [])
    with pytest.raises(InvalidArgument, match="dicts or bytes"):
        write_dataset(str(tmp_path / "ints"), [1, 2, 3])
    with pytest.raises(ValueError, match="rows_per_shard"):
        write_dataset(str(tmp_path / "zero"), [b"x"], rows_per_shard=0)
    assert not (tmp_path / "empty").exists()
    with pytest.raises(FileNotFoundError):
        read_manifest(str(tmp_path / "empty"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a graben dataset manifest"):
        read_manifest(str(tmp_path / "bad"))


def test_shards_are_sized_by_bytes(tmp_path: Any) -> None:
    blobs = pa.table(
        {"id": list(range(4000)), "blob": [bytes([i % 251]) * 700 for i in range(4000)]}
    )
    batches = blobs.to_batches(max_chunksize=333)  # a stream: one shard in memory at a time
    manifest = write_dataset(
        str(tmp_path / "rows"), iter(batches), shard_size="256K", compression=None
    )
    sizes = [s.size for s in manifest.shards]
    assert all(s <= (256 << 10) + (256 << 10) // 10 + 8192 for s in sizes)  # a group over, at most
    assert all(s >= 256 << 10 for s in sizes[:-1]) and len(sizes) == 11
    shards = _check_shards(str(tmp_path / "rows"), None, manifest)
    assert pa.concat_tables(pq.read_table(io.BytesIO(d)) for d in shards).equals(blobs)
    records = write_dataset(str(tmp_path / "rec"), [b"x" * 1000] * 1000, shard_size="100K")
    assert len(records.shards) == 10 and records.samples == 1000


def test_labels_from_a_column(tmp_path: Any) -> None:
    from graben.store.cli._main import main

    src = tmp_path / "pq"
    src.mkdir()
    species = ["oak", "ash", "elm", "ash"]
    for i in range(3):  # the classes come from every file, not the first
        table = pa.table(
            {"id": [i * 4 + j for j in range(4)], "species": species[i:] + species[:i]}
        )
        pq.write_table(table, src / f"part-{i}.parquet")
    url = str(tmp_path / "ds")
    assert main(["dataset", "write", str(src), url, "--label-column", "species"]) == 0
    manifest = read_manifest(url)
    assert manifest.classes == ("ash", "elm", "oak") and "label" in manifest.columns
    rows = pa.concat_tables(
        pq.read_table(io.BytesIO(d)) for d in _check_shards(url, None, manifest)
    ).to_pylist()
    assert len(rows) == 12
    assert all(manifest.classes[r["label"]] == r["species"] for r in rows)
    assert main(["dataset", "write", str(src), url, "--label-column", "genus"]) == 1


STREAMED = """
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
from graben.store.cli._main import main
src, url = sys.argv[1], sys.argv[2]
table = pa.table({"blob": [os.urandom(4096) for _ in range(2048)]})  # 8 MiB that do not compress
for i in range(24):
    pq.write_table(table, f"{src}/part-{i}.parquet", compression="none")
del table
assert main(["dataset", "write", src, url, "--shard-size", "8MiB"]) == 0
print(pa.default_memory_pool().max_memory())
"""


def test_a_directory_of_parquet_is_streamed_not_read_whole(tmp_path: Any) -> None:
    import subprocess
    import sys

    (tmp_path / "src").mkdir()
    out = subprocess.run(
        [sys.executable, "-c", STREAMED, str(tmp_path / "src"), str(tmp_path / "ds")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    peak = int(out.split()[-1])
    manifest = read_manifest(str(tmp_path / "ds"))
    assert manifest.samples == 24 * 2048 and len(manifest.shards) >= 20
    assert peak < 96 << 20, f"{peak >> 20} MiB of Arrow memory to pack 192 MiB"  # not 192+


def test_a_dataset_is_written_straight_into_a_storage_class(
    cluster_url: str, tmp_path: Any
) -> None:
    from graben.store import shared_client, split_url

    url = f"{cluster_url}/datasets/classed-{tmp_path.name}"
    table = pa.table({"id": list(range(100))})
    write_dataset(url, table, rows_per_shard=50, storage_class="ec:2+1")
    client = shared_client(split_url(url)[0])
    state = client.storage_class(f"{split_url(url)[1]}/manifest.json")
    assert state.name == "ec:2+1" and state.set_on == split_url(url)[1]
    with pytest.raises(InvalidArgument, match="graben:// dataset URL"):
        write_dataset(str(tmp_path / "local"), table, storage_class="ec:2+1")
    assert not (tmp_path / "local").exists()
