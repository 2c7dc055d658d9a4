"""``graben ckpt ls|rm|export``: checkpoints from the command line.

torch is imported only when a ``ckpt`` command runs, so that every other
``graben`` command starts without it.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import sys
import time
from pathlib import Path
from typing import Any

from graben.store import InvalidArgument, NotFound, connect, split_url

_URL_HELP = "graben://host:port/path, or graben:///path for the default store"


def add_ckpt(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``graben ckpt`` (entry point ``graben.commands:ckpt``)."""
    parser = sub.add_parser("ckpt", help="List, remove and export checkpoints.")
    commands = parser.add_subparsers(dest="ckpt_command", required=True)

    ls = commands.add_parser("ls", help="the checkpoints under a root, oldest first")
    ls.add_argument("root", help=f"the CheckpointManager root ({_URL_HELP})")
    ls.add_argument("--json", action="store_true", help="print JSON (and nothing else)")
    ls.set_defaults(run=_ls)

    rm = commands.add_parser("rm", help="remove checkpoints, or apply a retention rule")
    rm.add_argument(
        "urls", nargs="+", metavar="URL", help="checkpoints, or with --keep-last a root"
    )
    rm.add_argument("--keep-last", type=int, metavar="N", help="keep the newest N under ROOT")
    rm.set_defaults(run=_rm)

    export = commands.add_parser("export", help="write a checkpoint as one torch.save file")
    export.add_argument("url", help=f"the checkpoint ({_URL_HELP})")
    export.add_argument("out", type=Path, help="local file: .pt (torch.save) or .safetensors")
    export.set_defaults(run=_export)


def _ls(args: argparse.Namespace) -> int:
    from ._manager import CheckpointManager

    with CheckpointManager(args.root, keep_last=None) as manager:
        checkpoints = manager.list()
        latest = manager.latest()
        client = manager.client
        rows: list[dict[str, Any]] = [
            {
                "step": c.step,
                "url": c.url,
                "published": c.mtime,
                "bytes": client.du(split_url(c.url)[1])[1],
                "latest": latest is not None and latest.step == c.step,
            }
            for c in checkpoints
        ]
    if args.json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["published"]))
        mark = "  <- latest" if row["latest"] else ""
        print(f"{row['step']:>12}  {when}  {row['bytes']:>14}  {row['url']}{mark}")
    return 0


def _rm(args: argparse.Namespace) -> int:
    from ._manager import CheckpointManager
    from ._storage import METADATA

    if args.keep_last is not None:
        if len(args.urls) != 1 or args.keep_last < 1:
            raise InvalidArgument("--keep-last takes one root and N >= 1")
        with CheckpointManager(args.urls[0], keep_last=args.keep_last) as manager:
            for step in manager.apply_retention():
                print(f"removed {manager.url_of(step)}")
        return 0
    for url in args.urls:
        store, path = split_url(url)
        with connect(store) as client:
            if not client.exists(posixpath.join(path, METADATA)):  # a typo must not wipe a tree
                raise NotFound("not a checkpoint (no .metadata in it)", path)
            client.rm(path, recursive=True)
        print(f"removed {url}")
    return 0


def _export(args: argparse.Namespace) -> int:
    import torch
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from ._reader import GrabenReader

    state: dict[str, Any] = {}
    reader = GrabenReader(args.url)
    _load_state_dict(
        state,
        storage_reader=reader,
        planner=_EmptyStateDictLoadPlanner(),  # type: ignore[no-untyped-call]
        no_dist=True,
    )
    if args.out.suffix == ".safetensors":
        _save_safetensors(state, args.out)
    else:
        torch.save(state, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _save_safetensors(state: dict[str, Any], out: Path) -> None:
    import torch

    try:
        from safetensors.torch import save_file
    except ImportError:
        raise InvalidArgument("export to .safetensors needs: pip install safetensors") from None
    flat: dict[str, torch.Tensor] = {}
    extra: dict[str, str] = {}
    for key, value in _flatten(state):
        if isinstance(value, torch.Tensor):
            flat[key] = value.contiguous()
        else:
            extra[key] = repr(value)  # safetensors holds tensors; the rest goes in metadata
    save_file(flat, str(out), metadata=extra or None)


def _flatten(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(tree, dict):
        return [item for key, value in tree.items() for item in _flatten(value, f"{prefix}{key}.")]
    return [(prefix.rstrip("."), tree)]
