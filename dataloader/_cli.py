"""``graben dataset write|index|inspect|warm|cache``: datasets from the command line.

pyarrow and torch are imported only when a ``dataset`` command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from graben.store import GrabenError, InvalidArgument

_URL_HELP = "a dataset URL: graben://host:port/path, s3://bucket/path, file:// or a local path"


def add_dataset(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``graben dataset`` (entry point ``graben.commands:dataset``)."""
    parser = sub.add_parser("dataset", help="Write, inspect and cache sharded datasets.")
    commands = parser.add_subparsers(dest="dataset_command", required=True)

    write = commands.add_parser("write", help="pack files or Parquet rows into shards")
    write.add_argument(
        "source",
        type=Path,
        help="a .parquet file, or a directory: of .parquet files (rows), else one sample a file",
    )
    write.add_argument("url", help=_URL_HELP)
    write.add_argument("--rows-per-shard", type=int, default=10_000, metavar="N")
    write.add_argument("--rows-per-group", type=int, default=None, metavar="N")
    write.set_defaults(run=_guarded(_write))

    index = commands.add_parser("index", help="make the files at a URL a dataset, as they are")
    index.add_argument("url", help=_URL_HELP)
    index.set_defaults(run=_guarded(_index))

    inspect = commands.add_parser("inspect", help="what a dataset's manifest says")
    inspect.add_argument("url", help=_URL_HELP)
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    inspect.set_defaults(run=_guarded(_inspect))

    warm = commands.add_parser("warm", help="fill this node's cache with a dataset's shards")
    warm.add_argument("url", help=_URL_HELP)
    _cache_options(warm)
    warm.set_defaults(run=_guarded(_warm))

    cache = commands.add_parser("cache", help="show this node's cache, or clear it")
    _cache_options(cache)
    cache.add_argument("--clear", action="store_true", help="remove every cached shard")
    cache.set_defaults(run=_guarded(_cache))


def _cache_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="a directory of yours that no one else can write to"
        " (default: $TMPDIR/graben-<uid>/datasets)",
    )
    parser.add_argument("--cache-limit", type=int, default=None, metavar="BYTES")


def _guarded(run: Any) -> Any:
    """Bad input as one line (``graben: ...``), not a traceback."""

    def guarded(args: argparse.Namespace) -> int:
        try:
            code: int = run(args)
        except GrabenError:
            raise  # already one line: ``main`` shows its message and the path
        except (OSError, ValueError, TypeError) as exc:
            raise InvalidArgument(str(exc)) from exc
        return code

    return guarded


def _write(args: argparse.Namespace) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ._writer import write_dataset

    source: Path = args.source
    data: Any
    if source.is_file():
        data = pq.read_table(source)
    elif source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.is_file())
        if files and all(p.suffix == ".parquet" for p in files):
            data = pa.concat_tables(pq.read_table(p) for p in files)
        else:
            data = (p.read_bytes() for p in files)  # one sample a file
    else:
        raise FileNotFoundError(f"no such file or directory: {source}")
    manifest = write_dataset(
        args.url, data, rows_per_shard=args.rows_per_shard, rows_per_group=args.rows_per_group
    )
    print(f"{manifest.samples} samples in {len(manifest.shards)} shards at {args.url}")
    return 0


def _index(args: argparse.Namespace) -> int:
    from ._writer import index_files

    manifest = index_files(args.url)
    print(f"{manifest.samples} files ({manifest.size} bytes) indexed at {args.url}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import msgspec

    from ._writer import read_manifest

    manifest = read_manifest(args.url)
    if args.json:
        sys.stdout.write(msgspec.json.encode(manifest).decode() + "\n")
        return 0
    print(f"{args.url}: {manifest.kind}, {manifest.samples} samples, {len(manifest.shards)} shards")
    print(f"  {manifest.size} bytes; columns: {', '.join(manifest.columns) or '-'}")
    return 0


def _warm(args: argparse.Namespace) -> int:
    from ._dataset import CachedDataset

    ds = CachedDataset(args.url, cache_dir=args.cache_dir, cache_limit=args.cache_limit)
    ds.warm()
    stats = ds.stats
    print(json.dumps({"shards": len(ds.manifest.shards), **stats}))
    return 0


def _cache(args: argparse.Namespace) -> int:
    from ._cache import NodeCache, default_dir

    cache = NodeCache(args.cache_dir or default_dir(), args.cache_limit)
    if args.clear:
        print(f"cleared {cache.clear()} bytes from {cache.root}")
        return 0
    files = [e for e in os.scandir(cache.root) if e.is_file(follow_symlinks=False)]
    print(f"{cache.root}: {len(files)} shards, {cache.used()} bytes")
    return 0
