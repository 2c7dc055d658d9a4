"""A certificate authority of the test's own (trustme), its files on disk.

``make_pki(root)`` writes a CA, a server certificate for 127.0.0.1 (what the
tests' servers listen on and advertise), a client certificate of the same CA,
one of a CA nobody trusts, and a server certificate for another host name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

from graben.store import TLS


@dataclass(frozen=True)
class Pki:
    """Files of a CA and the certificates it signed, as ``TLS`` values."""

    ca: Path
    """The CA's certificate: what clients and servers trust."""
    server: TLS
    """The servers' certificate (for 127.0.0.1) and key, trusting ``ca``."""
    client: TLS
    """A client certificate signed by ``ca``, trusting ``ca``."""
    stranger: TLS
    """A client certificate of another CA (trusting ``ca``)."""
    elsewhere: TLS
    """A server certificate of ``ca`` for another host name."""

    def server_flags(self, *, client_auth: bool = False) -> tuple[str, ...]:
        """A server's TLS flags for ``server``'s files."""
        flags = ("--tls-cert", str(self.server.cert), "--tls-key", str(self.server.key))
        flags = (*flags, "--tls-ca", str(self.ca))
        return (*flags, "--tls-client-auth", "required") if client_auth else flags


def _issue(ca: trustme.CA, name: str, root: Path, trust: Path) -> TLS:
    root.mkdir(parents=True, exist_ok=True)
    cert = ca.issue_cert(name)
    cert.cert_chain_pems[0].write_to_path(str(root / f"{name}.pem"))
    cert.private_key_pem.write_to_path(str(root / f"{name}.key"))
    return TLS(ca=trust, cert=root / f"{name}.pem", key=root / f"{name}.key")


def make_pki(root: Path) -> Pki:
    """A fresh CA and its certificates, written under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    trust = root / "ca.pem"
    ca.cert_pem.write_to_path(str(trust))
    return Pki(
        ca=trust,
        server=_issue(ca, "127.0.0.1", root, trust),
        client=_issue(ca, "client.graben.test", root, trust),
        stranger=_issue(other, "client.graben.test", root / "other", trust),
        elsewhere=_issue(ca, "elsewhere.graben.test", root, trust),
    )
