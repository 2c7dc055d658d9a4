"""``graben tenant``, ``graben token`` and ``graben quota``: many teams on one cluster.

The operator (holding the cluster secret) adds tenants, each with a root
directory and the root's quota, and issues tokens bound to a tenant, a
prefix within its root, rights and an expiry; a token's text is printed once
(``--out FILE`` writes it to a new 0600 file instead). Anyone sees the quotas
their token reaches with ``graben quota``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import datetime

from .._errors import InvalidArgument
from .._types import QuotaState, TokenInfo
from . import _render as out
from ._cmds import Subparsers, _command, _human_flag, _json_flag
from ._listen import count_arg, size_arg
from ._page import add_cluster_token
from ._stores import open_client

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def duration_arg(text: str) -> float:
    """``7d``, ``12h``, ``30m``, ``90s`` or ``90`` as seconds, or argparse's usage error."""
    found = re.fullmatch(r"\s*([0-9]+)\s*([smhdwy]?)\s*", text)
    if found is None or int(found.group(1)) == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: a number with s, m, h, d, w or y (7d)"
        )
    return float(int(found.group(1)) * _UNITS[found.group(2) or "s"])


def _limits(parser: argparse.ArgumentParser) -> None:
    for flag, what in (
        ("--bytes", "logical bytes (10G)"),
        ("--physical", "bytes on disk, every copy counted (30G)"),
    ):
        parser.add_argument(flag, type=size_arg, default=0, metavar="SIZE", help=f"most {what}")
    parser.add_argument(
        "--files", type=count_arg, default=0, metavar="N", help="most files (10000, 10k, 10M)"
    )


def add_tenant(sub: Subparsers) -> None:
    """``graben tenant add NAME --root DIR [--bytes --physical --files]``, ``tenant ls``."""
    parser = sub.add_parser(
        "tenant",
        help="Add or list tenants (the operator's).",
        description="Add or list tenants: teams that each own a directory and its quota.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = _command(actions, "add", "Add a tenant with its root directory and quota.", _add)
    add.add_argument("name", help="the tenant's name (a-z, 0-9, '_', '.', '-')")
    add.add_argument("--root", required=True, help="its directory (made), e.g. /teams/NAME")
    _limits(add)
    listing = _command(actions, "ls", "List the tenants with their roots and usage.", _tenants)
    _json_flag(listing)
    _human_flag(listing)


def add_token(sub: Subparsers) -> None:
    """``graben token create|ls|revoke|cluster``."""
    parser = sub.add_parser(
        "token",
        help="Issue, list or revoke tenants' tokens (the operator's).",
        description="Issue, list or revoke tenants' tokens (the operator's).",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    make = _command(actions, "create", "Issue a token; its text is printed once.", _create)
    make.add_argument("--tenant", required=True)
    make.add_argument("--prefix", default="", help="what it reaches (default: the tenant's root)")
    make.add_argument("--rights", default="rw", help="r read, w write, a admin (default: rw)")
    make.add_argument(
        "--expires", type=duration_arg, default=7 * 86400.0, metavar="AGE", help="7d (default)"
    )
    make.add_argument("--out", metavar="FILE", help="write it to this new file (0600) instead")
    listing = _command(actions, "ls", "List tokens (never their text).", _tokens)
    listing.add_argument("--tenant", default="", help="only this tenant's")
    _json_flag(listing)
    revoke = _command(actions, "revoke", "Revoke tokens: refused everywhere within 1 s.", _revoke)
    revoke.add_argument("ids", nargs="*", metavar="ID", help="token ids (token ls shows them)")
    revoke.add_argument("--tenant", default="", help="every token of this tenant")
    add_cluster_token(actions)


def add_quota(sub: Subparsers) -> None:
    """``graben quota [PATH]``, ``graben quota set PATH ...``, ``graben quota clear PATH``."""
    parser = sub.add_parser(
        "quota",
        help="Show or set the quotas of directories.",
        description="Show quotas with their usage, or set a directory's.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = _command(actions, "show", "Show the quotas above, at and below a path.", _show)
    show.add_argument("path", nargs="?", default="", help="store path (default: every quota)")
    _json_flag(show)
    _human_flag(show)
    put = _command(actions, "set", "Set a directory's quota (0: no limit of a kind).", _set)
    put.add_argument("path", help="a directory")
    _limits(put)
    clear = _command(actions, "clear", "Remove a directory's quota.", _clear)
    clear.add_argument("path", help="a directory")


def _add(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        quota = client.add_tenant(
            args.name,
            args.root,
            max_bytes=args.bytes,
            max_physical=args.physical,
            max_files=args.files,
        )
    out.emit_lines(_quota_lines([quota], human=True))
    return 0


def _tenants(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        roots = client.tenants()
        quotas = {q.path: q for q in client.quotas()}
    if args.json:
        out.emit_json({name: quotas.get(root) for name, root in sorted(roots.items())})
        return 0
    shown = [quotas[root] for _, root in sorted(roots.items()) if root in quotas]
    out.emit_lines(_quota_lines(shown, human=args.human))
    return 0


def _create(args: argparse.Namespace) -> int:
    fd = None
    if args.out:  # made first: a token is never issued only to find nowhere to keep it
        try:
            fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise InvalidArgument("exists: not overwritten", args.out) from None
    try:
        with open_client(args.store, args) as client:
            token = client.issue_token(
                args.tenant, prefix=args.prefix, rights=args.rights, ttl_s=args.expires
            )
    except BaseException:
        if fd is not None:
            os.close(fd)
            os.unlink(args.out)
        raise
    if fd is not None:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    else:
        sys.stdout.write(token + "\n")
    ident = token.split("_")[1]
    until = datetime.fromtimestamp(time.time() + args.expires).strftime("%Y-%m-%d %H:%M")
    print(f"graben: token {ident} of tenant {args.tenant} until {until}", file=sys.stderr)
    return 0


def _tokens(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        tokens = client.tokens(args.tenant)
    return _emit(args, tokens, [_token_line(t) for t in tokens])


def _revoke(args: argparse.Namespace) -> int:
    if not args.ids and not args.tenant:
        raise InvalidArgument("name the token ids to revoke, or --tenant")
    with open_client(args.store, args) as client:
        count = client.revoke_tokens(*args.ids, tenant=args.tenant)
    print(f"graben: {count} token(s) revoked", file=sys.stderr)
    return 0


def _show(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        quotas = client.quotas(args.path)
    return _emit(args, quotas, _quota_lines(quotas, human=args.human))


def _set(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        quota = client.set_quota(
            args.path, max_bytes=args.bytes, max_physical=args.physical, max_files=args.files
        )
    out.emit_lines(_quota_lines([quota], human=True))
    return 0


def _clear(args: argparse.Namespace) -> int:
    with open_client(args.store, args) as client:
        client.set_quota(args.path)
    return 0


def _emit(args: argparse.Namespace, value: object, lines: list[str]) -> int:
    """``value`` as JSON with ``--json``, else ``lines``."""
    if args.json:
        out.emit_json(value)
    else:
        out.emit_lines(lines)
    return 0


def _quota_lines(quotas: list[QuotaState], *, human: bool) -> list[str]:
    def of(used: int, limit: int, size: bool) -> str:
        text = (lambda n: out.size_text(n, human)) if size else str
        return f"{text(used)}/{text(limit) if limit else '-'}"

    lines = []
    for q in quotas:
        owner = f"tenant {q.tenant}" if q.tenant else "directory"
        disk = of(q.physical, q.max_physical, True)
        lines.append(
            f"{out.shown(q.path)}  {owner}  bytes {of(q.bytes, q.max_bytes, True)}  "
            f"on disk {disk}  files {of(q.files, q.max_files, False)}"
        )
    return lines


def _token_line(token: TokenInfo) -> str:
    state = "revoked" if token.revoked else "expired" if token.expires <= time.time() else "live"
    until = datetime.fromtimestamp(token.expires).strftime("%Y-%m-%d %H:%M")
    return (
        f"{token.id}  {token.tenant}  {out.shown(token.prefix)}  {token.rights}  {until}  {state}"
    )
