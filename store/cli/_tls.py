"""TLS on the command line: a server's flags, a client command's flags and environment.

A server given ``--tls-cert`` (and ``--tls-key``, unless the key is in the
same file) speaks TLS only. ``--tls-ca`` is the CA it checks its peers
against: the metadata service a node heartbeats to, the nodes the service
repairs through, the nodes a chain passes through, and, with
``--tls-client-auth required`` (mutual TLS), every client. A server dialling
another always shows its own certificate, so mutual TLS needs nothing more.
``cluster up`` passes its TLS flags on to each of its servers.

A client command reaches a TLS cluster with ``--tls-ca`` (and, where client
certificates are required, ``--tls-cert``/``--tls-key``), each defaulting to
``$GRABEN_TLS_CA``, ``$GRABEN_TLS_CERT``, ``$GRABEN_TLS_KEY``: the variables
the library reads too, so the fsspec door, the mount, DCP and datasets need
no flags of their own.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .._config import TLS, tls_from_env
from .._errors import InvalidArgument
from ..wire import tls as wire_tls


def server_tls_args(serve: argparse.ArgumentParser) -> None:
    """A server's TLS flags (``cluster up`` passes them on to each of its servers)."""
    serve.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        help="PEM certificate (chain) this server shows; with it the server speaks TLS only "
        "(its SANs must name the address others dial: --advertise, else --listen)",
    )
    serve.add_argument(
        "--tls-key",
        type=Path,
        default=None,
        help="PEM private key of --tls-cert (default: in the --tls-cert file)",
    )
    serve.add_argument(
        "--tls-ca",
        type=Path,
        default=None,
        help="PEM CA certificates this server trusts: its peers' (metadata service, other "
        "nodes) and, with --tls-client-auth required, clients' (default: the system's)",
    )
    serve.add_argument(
        "--tls-client-auth",
        choices=("none", "required"),
        default="none",
        help="required: every client must show a certificate signed by --tls-ca "
        "(mutual TLS; servers dialling each other show theirs); default: none",
    )


def server_tls(args: argparse.Namespace) -> TLS | None:
    """The TLS a server's flags ask for, its files checked (before a server touches its
    engine or disk); ``None``: plaintext."""
    auth_required = args.tls_client_auth == "required"
    if args.tls_cert is None:
        if args.tls_key is not None or args.tls_ca is not None or auth_required:
            raise InvalidArgument(
                "--tls-key, --tls-ca and --tls-client-auth need --tls-cert: a server speaks "
                "TLS only with a certificate of its own"
            )
        return None
    if auth_required and args.tls_ca is None:
        raise InvalidArgument(
            "--tls-client-auth required needs --tls-ca, the CA that signs client certificates"
        )
    tls = TLS(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, client_auth=auth_required)
    wire_tls.server_context(tls)  # loads every file: a bad one stops the server now
    return tls


def tls_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """``cluster up``'s TLS flags as its servers take them (files made absolute)."""
    flags: tuple[str, ...] = ()
    for name in ("tls_cert", "tls_key", "tls_ca"):
        path: Path | None = getattr(args, name)
        if path is not None:
            flags = (*flags, "--" + name.replace("_", "-"), str(path.resolve()))
    if args.tls_client_auth != "none":
        flags = (*flags, "--tls-client-auth", args.tls_client_auth)
    return flags


def tls_hint(tls: TLS | None) -> str:
    if tls is None:
        return ""
    if tls.ca is None:
        hint = "\nTLS: clients trust its certificate if it chains to their system's CAs"
    else:
        hint = f"\nand for TLS: export GRABEN_TLS_CA={Path(tls.ca).resolve()}"
    if tls.client_auth:
        hint += " GRABEN_TLS_CERT=... GRABEN_TLS_KEY=... (a client certificate signed by it)"
    return hint


def tls_arg(parser: argparse.ArgumentParser) -> None:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key``: how a client command reaches a TLS cluster
    (each, when not given, from ``$GRABEN_TLS_CA``, ``$GRABEN_TLS_CERT``, ``$GRABEN_TLS_KEY``)."""
    parser.add_argument(
        "--tls-ca",
        metavar="FILE",
        default=None,
        help="PEM CA certificates the cluster's certificates must chain to; connect over TLS "
        "(default: $GRABEN_TLS_CA; neither this nor --tls-cert: plaintext)",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="FILE",
        default=None,
        help="PEM client certificate, for a cluster that requires one (default: $GRABEN_TLS_CERT)",
    )
    parser.add_argument(
        "--tls-key",
        metavar="FILE",
        default=None,
        help="PEM private key of --tls-cert (default: $GRABEN_TLS_KEY, else in --tls-cert's file)",
    )


def client_tls(args: argparse.Namespace) -> TLS | None:
    """The TLS a client command's flags and environment ask for; ``None``: plaintext."""
    return tls_from_env(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
