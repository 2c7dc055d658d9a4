"""``graben node drain ID`` and ``graben node rm ID``: retiring a data node's host.

``drain`` records the node as draining: nothing new is placed on it and the
leader's repair rounds copy each chunk it holds to another node (failure
domains kept), then forget its copy; erasure-coded pieces on it are made again
elsewhere. Reads and writes go on meanwhile. ``status`` shows the copies it
still holds, and ``drained`` once none is left; then stop it and ``rm`` it.
``rm`` is refused while the node runs or holds the only copy of anything.
"""

from __future__ import annotations

import argparse

from . import _render as out
from ._cmds import Subparsers, _command, _json_flag
from ._stores import open_client


def add_node_actions(actions: Subparsers) -> None:
    """``drain ID [--undo] [--json]`` and ``rm ID`` under ``graben node``."""
    drain = _command(
        actions,
        "drain",
        "Move every copy and piece off a data node in the background (the operator's); "
        "graben status shows the copies left, then 'drained'.",
        _drain,
    )
    drain.add_argument("id", help="the node's id (graben status shows it)")
    drain.add_argument(
        "--undo", action="store_true", help="put a draining node back in service instead"
    )
    _json_flag(drain)
    remove = _command(
        actions,
        "rm",
        "Forget a stopped data node (the operator's); refused while it runs or holds the "
        "only copy of anything: drain it first.",
        _remove,
    )
    remove.add_argument("id", help="the node's id (graben status shows it)")


def _drain(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        node = client.drain_node(args.id, undo=args.undo)
    if args.json:
        out.emit_json(node)
        return 0
    state = node.state or "in service"
    out.emit_lines([f"node {node.id}: {state}, {node.held} copies and pieces on it"])
    return 0


def _remove(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        client.remove_node(args.id)
    out.emit_lines([f"node {args.id} removed"])
    return 0
