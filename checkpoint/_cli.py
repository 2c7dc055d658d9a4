"""``graben ckpt ls|rm|export``: checkpoints from the command line.

torch is imported only when a ``ckpt`` command runs, so that every other
``graben`` command starts without it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import posixpath
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

from graben.store import (
    AgentClient,
    Client,
    FileInfo,
    GrabenError,
    Held,
    InvalidArgument,
    IsADirectory,
    NotADirectory,
    NotFound,
    Unavailable,
    connect,
    split_url,
)

_URL_HELP = "graben://host:port/path, or graben:///path for the default store"


def add_ckpt(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``graben ckpt`` (entry point ``graben.commands:ckpt``)."""
    parser = sub.add_parser("ckpt", help="List, remove and export checkpoints.")
    commands = parser.add_subparsers(dest="ckpt_command", required=True)

    ls = commands.add_parser("ls", help="the checkpoints under a root, oldest first")
    ls.add_argument("root", help=f"the CheckpointManager root ({_URL_HELP})")
    ls.add_argument("--json", action="store_true", help="print JSON (and nothing else)")
    ls.add_argument(
        "--agent",
        default=None,
        metavar="HOST:PORT",
        help="the memory agent to ask which steps it holds (default: $GRABEN_AGENT, else "
        "127.0.0.1:7300 if one answers there)",
    )
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
    # No torch here: listing reads names and sizes (a second or two less per call)
    from ._steps import jobs_below, listing, with_memory

    store, root = split_url(args.root)
    _require_root(args.root)
    with connect(store) as client:
        listed = listing(client, args.root, root)
        jobs = [] if listed or args.json else jobs_below(client, args.root, root)
    held = _held(args.agent, args.root.rstrip("/"))
    if held is not None:
        listed = with_memory(listed, held, args.root)
    rows = [dataclasses.asdict(row) for row in listed]
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        below = f"; jobs below it: {', '.join(jobs)} (graben ckpt ls URL)" if jobs else ""
        print(f"no checkpoints in {args.root}{below}", file=sys.stderr)
    for row in rows:
        published = row["published"]
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(published)) if published else "-"
        mark = "  <- latest" if row["latest"] else ""
        step = "-" if row["step"] is None else row["step"]
        tiers = f"  [{row['tiers']}]" if held is not None else ""
        print(f"{step:>12}  {when:>19}  {row['bytes']:>14}  {row['url']}{mark}{tiers}")
    return 0


def _held(agent: str | None, job: str) -> list[Held] | None:
    """What the memory agent holds of ``job``; ``None`` if there is none to ask (an
    agent named by ``--agent`` that does not answer is an error)."""
    client = AgentClient(agent)
    try:
        return client.listing(job)
    except Unavailable:
        if agent is not None:
            raise
        return None
    finally:
        client.close()


def _rm(args: argparse.Namespace) -> int:
    from ._manager import CheckpointManager

    if args.keep_last is not None:
        if len(args.urls) != 1 or args.keep_last < 1:
            raise InvalidArgument("--keep-last takes one root and N >= 1")
        _require_root(args.urls[0])
        with CheckpointManager(args.urls[0], keep_last=args.keep_last) as manager:
            for step in manager.apply_retention():
                print(f"removed {manager.url_of(step)}")
        return 0
    for url in args.urls:
        keep = "or keep the newest N: graben ckpt rm ROOT --keep-last N"
        _require_checkpoint(url, "remove", keep)
        store, path = split_url(url)
        with connect(store) as client:
            client.rm(path, recursive=True)
        print(f"removed {url}")
    return 0


def _export(args: argparse.Namespace) -> int:
    out: Path = args.out
    _require_checkpoint(args.url, "export", "graben ckpt ls ROOT lists them")
    if out.is_dir():
        raise IsADirectory("is a directory: name the file to write (.pt or .safetensors)", str(out))
    if not out.parent.is_dir():
        raise NotFound("no such local directory", str(out.parent))
    state = _load(args.url)
    part = out.with_name(f".{out.name}.part")  # renamed over ``out`` once whole
    try:
        with open(part, "wb") as sink:
            _write_state(state, out.suffix, sink)
        os.replace(part, out)
    except OSError as exc:
        raise GrabenError(f"cannot write the export: {exc.strerror or exc}", str(out)) from exc
    finally:
        part.unlink(missing_ok=True)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _load(url: str) -> dict[str, Any]:
    """The whole checkpoint at ``url``, as DCP loads it without a process group."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from ._reader import GrabenReader

    state: dict[str, Any] = {}
    try:
        _load_state_dict(
            state,
            storage_reader=GrabenReader(url),
            planner=_EmptyStateDictLoadPlanner(),  # type: ignore[no-untyped-call]
            no_dist=True,
        )
    except (Exception, CheckpointException) as exc:  # DCP wraps what failed (a BaseException)
        raise GrabenError(f"cannot read the checkpoint ({_last_line(exc)})", url) from exc
    return state


def _last_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[-1].strip() if lines else type(exc).__name__


def _write_state(state: dict[str, Any], suffix: str, sink: BinaryIO) -> None:
    import torch

    if suffix == ".safetensors":
        sink.write(_safetensors(state))
    else:
        torch.save(state, sink)


def _require_root(url: str) -> None:
    """Refuse, in one line, a root that is missing or a file."""
    store, path = split_url(url)
    with connect(store) as client:
        info = _stat(client, path, url, "no such checkpoint root")
    if not info.is_dir:
        raise NotADirectory("not a checkpoint root but a file", url)


def _require_checkpoint(url: str, verb: str, hint: str) -> None:
    """Refuse, in one line, anything but one checkpoint (a directory holding its
    ``.metadata``); a root's error names one of its steps (``verb`` that one)."""
    from ._steps import checkpoint_steps
    from ._storage import METADATA

    store, path = split_url(url)
    with connect(store) as client:
        info = _stat(client, path, url, "no such checkpoint")
        if not info.is_dir:
            raise NotADirectory("not a checkpoint but a file", url)
        if client.exists(posixpath.join(path, METADATA)):
            return
        steps = checkpoint_steps(client.ls(path))
    if not steps:
        raise InvalidArgument(f"not a checkpoint (no {METADATA} in it)", url)
    newest = f"{url.rstrip('/')}/{steps[-1]}"
    raise InvalidArgument(
        f"{url} is a checkpoint root, not a checkpoint: {verb} one of its {len(steps)} "
        f"steps, e.g. {newest} (the newest; {hint.replace('ROOT', url)})"
    )


def _stat(client: Client, path: str, url: str, missing: str) -> FileInfo:
    try:
        return client.stat(path)
    except NotFound:
        raise NotFound(missing, url) from None


def _safetensors(state: dict[str, Any]) -> bytes:
    import torch

    try:
        from safetensors.torch import save
    except ImportError:
        raise InvalidArgument("export to .safetensors needs: pip install safetensors") from None
    flat: dict[str, torch.Tensor] = {}
    extra: dict[str, str] = {}
    for key, value in _flatten(state):
        if isinstance(value, torch.Tensor):
            flat[key] = value.contiguous()
        else:
            extra[key] = repr(value)  # safetensors holds tensors; the rest goes in metadata
    data: bytes = save(flat, metadata=extra or None)
    return data


def _flatten(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(tree, dict):
        return [item for key, value in tree.items() for item in _flatten(value, f"{prefix}{key}.")]
    return [(prefix.rstrip("."), tree)]
