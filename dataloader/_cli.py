"""``graben dataset write|index|inspect|warm|cache``: datasets from the command line.

pyarrow and torch are imported only when a ``dataset`` command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from graben.store import GrabenError, InvalidArgument, NotFound, parse_size

_URL_HELP = "a dataset URL: graben://host:port/path, s3://bucket/path, file:// or a local path"


def add_dataset(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``graben dataset`` (entry point ``graben.commands:dataset``)."""
    parser = sub.add_parser("dataset", help="Write, inspect and cache sharded datasets.")
    commands = parser.add_subparsers(dest="dataset_command", required=True)

    write = commands.add_parser(
        "write",
        help="pack files or Parquet rows into shards",
        description="Pack a .parquet file or a directory of them (rows, streamed batch by"
        " batch), or a directory of files (one sample a file: its relative path as 'key',"
        " its bytes as 'data', and a 'label' from its folder when every file is in one,"
        " as torchvision's ImageFolder) into shards and a manifest.",
    )
    write.add_argument(
        "source",
        type=Path,
        help="a .parquet file, or a directory: of .parquet files (rows), else one sample a file",
    )
    write.add_argument("url", help=_URL_HELP)
    write.add_argument(
        "--shard-size",
        type=_size,
        default=256 << 20,
        metavar="SIZE",
        help="bytes a shard holds at most, give or take a group (default: 256MiB)",
    )
    write.add_argument(
        "--rows-per-shard", type=int, default=None, metavar="N", help="rows a shard holds at most"
    )
    write.add_argument(
        "--rows-per-group",
        type=int,
        default=None,
        metavar="N",
        help="rows a reader decodes at once (default: a tenth of a shard)",
    )
    write.add_argument(
        "--label-column",
        default=None,
        metavar="COLUMN",
        help="Parquet: the column whose values are the labels; they become a 'label' column"
        " of integers and the manifest's classes",
    )
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
        " (default: $XDG_CACHE_HOME/graben/datasets, else ~/.cache/graben/datasets)",
    )
    parser.add_argument(
        "--cache-limit",
        type=_size,
        default=None,
        metavar="SIZE",
        help="the most the cache may hold, such as 50G (default: 100G, at most half its disk)",
    )


def _size(text: str) -> int:
    """``parse_size`` for argparse, which shows only an ArgumentTypeError's own words."""
    try:
        return parse_size(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    from ._sources import source_batches
    from ._writer import write_dataset

    data, classes = source_batches(args.source, label_column=args.label_column)
    manifest = write_dataset(
        args.url,
        data,
        rows_per_shard=args.rows_per_shard,
        rows_per_group=args.rows_per_group,
        shard_size=args.shard_size,
        classes=classes,
    )
    labels = f", {len(manifest.classes)} classes" if manifest.classes else ""
    print(f"{manifest.samples} samples in {len(manifest.shards)} shards{labels} at {args.url}")
    return 0


def _index(args: argparse.Namespace) -> int:
    from ._writer import index_files

    manifest = index_files(args.url)
    print(f"{manifest.samples} files ({manifest.size} bytes) indexed at {args.url}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import msgspec

    manifest = _manifest(args.url)
    if args.json:
        sys.stdout.write(msgspec.json.encode(manifest).decode() + "\n")
        return 0
    print(f"{args.url}: {manifest.kind}, {manifest.samples} samples, {len(manifest.shards)} shards")
    print(f"  {manifest.size} bytes; columns: {', '.join(manifest.columns) or '-'}")
    if manifest.classes:
        shown = ", ".join(manifest.classes[:10]) + (", ..." if len(manifest.classes) > 10 else "")
        print(f"  {len(manifest.classes)} classes: {shown}")
    return 0


def _manifest(url: str) -> Any:
    """The dataset's manifest, or ``NotFound`` saying there is no dataset at ``url``."""
    from ._writer import read_manifest

    try:
        return read_manifest(url)
    except FileNotFoundError:
        raise NotFound(
            f"no dataset here (no manifest.json; make one with `graben dataset write` or"
            f" `graben dataset index`): {url}"
        ) from None
    except (IsADirectoryError, NotADirectoryError):
        raise NotFound(f"no dataset here (manifest.json is not a file): {url}") from None


def _warm(args: argparse.Namespace) -> int:
    from ._shards import ShardSource  # not torch: warming needs none

    _manifest(args.url)  # a missing dataset as one line
    ds = ShardSource(args.url, cache_dir=args.cache_dir, cache_limit=args.cache_limit)
    with _progress(len(ds.manifest.shards), ds.manifest.size) as advance:
        ds.warm(progress=advance)
    cache = ds.cache_stats
    stats = {
        "cache_hits": cache.hits,
        "cache_fills": cache.fills,
        "bytes_fetched": cache.bytes_fetched,
        "refetched": cache.refetched,
    }
    print(json.dumps({"shards": len(ds.manifest.shards), **stats}))
    return 0


@contextlib.contextmanager
def _progress(shards: int, size: int) -> Iterator[Callable[[int], None]]:
    """A bar of shards warmed on a terminal (stderr); nothing in a log or a pipe."""
    if not sys.stderr.isatty():
        yield lambda _: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    columns = ("{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"warming {shards} shards", total=size)
        yield lambda done: bar.advance(task, done)


def _cache(args: argparse.Namespace) -> int:
    from ._cache import NodeCache, default_limit
    from ._cache_dir import default_dir

    root = args.cache_dir or default_dir()
    cache = NodeCache(root, args.cache_limit or default_limit(root))
    if args.clear:
        print(f"cleared {cache.clear()} bytes from {cache.root}")
        return 0
    files = [e for e in os.scandir(cache.root) if e.is_file(follow_symlinks=False)]
    print(f"{cache.root}: {len(files)} shards, {cache.used()} bytes of at most {cache.limit}")
    return 0
