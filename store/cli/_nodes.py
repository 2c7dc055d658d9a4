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

from .._errors import InvalidArgument
from ..client import Client
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
    drain.add_argument(
        "id", help="the node's id, as graben status shows it (a unique start), or its address"
    )
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
    remove.add_argument(
        "id", help="the node's id, as graben status shows it (a unique start), or its address"
    )


def _drain(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        node = client.drain_node(_node(client, args.id), undo=args.undo)
    if args.json:
        out.emit_json(node)
        return 0
    state = node.state or "in service"
    out.emit_lines([f"node {node.id}: {state}, {node.held} copies and pieces on it"])
    return 0


def _remove(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        node = _node(client, args.id)
        client.remove_node(node)
    out.emit_lines([f"node {node} removed"])
    return 0


def _node(client: Client, given: str) -> str:
    """The full id of the node ``given`` names: its id, the start of one (``status``
    shows 12 characters), or its address; as given when none matches (the service
    then says it is not registered)."""
    if not given:
        raise InvalidArgument("name a data node: its id or its address (graben status)")
    nodes = client.health().nodes
    if any(n.id == given for n in nodes):
        return given
    found = {n.id for n in nodes if n.id.startswith(given) or n.address == given}
    if len(found) > 1:
        raise InvalidArgument(
            f"{given!r} names {len(found)} data nodes ({', '.join(sorted(found))}): give more "
            "of the id"
        )
    return found.pop() if found else given
