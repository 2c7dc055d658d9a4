"""TLS settings: the files of one process (``TLS``), and a client's from the environment.

The servers' flags (``--tls-*``) and a client's (``connect(tls=...)``,
``$GRABEN_TLS_CA`` and friends) both end as a ``TLS``; ``wire/_tls.py`` turns
one into an ``ssl.SSLContext``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .._errors import InvalidArgument
from ._env import ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY, env

FilePath = str | os.PathLike[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class TLS:
    """The TLS files of one process: the CA it trusts, the certificate it shows.

    A client needs ``ca`` (unless the cluster's certificates chain to the
    system's trust store), and ``cert``/``key`` only for a cluster that
    requires client certificates. A server needs ``cert``/``key``; ``ca``
    verifies its own peers (and, with ``client_auth``, every client).
    """

    ca: FilePath | None = None
    """PEM file of the CA certificates a peer's certificate must chain to (``None``:
    the system's trust store)."""
    cert: FilePath | None = None
    """PEM file of this process's certificate (chain): a server's own, or a client's
    for mutual TLS."""
    key: FilePath | None = None
    """PEM file of ``cert``'s private key (``None``: it is in the ``cert`` file)."""
    client_auth: bool = False
    """A server only: require every client to show a certificate signed by ``ca``."""

    def __post_init__(self) -> None:
        if self.key is not None and self.cert is None:
            raise InvalidArgument("a TLS key needs its certificate too (cert=..., --tls-cert)")
        if self.client_auth and self.ca is None:
            raise InvalidArgument(
                "requiring client certificates needs the CA that signs them (ca=..., --tls-ca)"
            )


def tls_from_env(
    *, ca: FilePath | None = None, cert: FilePath | None = None, key: FilePath | None = None
) -> TLS | None:
    """A client's ``TLS``: each file given here, else ``$GRABEN_TLS_CA``,
    ``$GRABEN_TLS_CERT``, ``$GRABEN_TLS_KEY``; ``None`` (plaintext) when none is
    given or set. An empty variable counts as unset."""
    ca = ca or env(ENV_TLS_CA)
    cert = cert or env(ENV_TLS_CERT)
    key = key or env(ENV_TLS_KEY)
    if ca is None and cert is None and key is None:
        return None
    if key is not None and cert is None:
        raise InvalidArgument(
            f"a TLS key (${ENV_TLS_KEY}, --tls-key) needs its certificate too "
            f"(${ENV_TLS_CERT}, --tls-cert)"
        )
    return TLS(ca=ca, cert=cert, key=key)
