"""TLS for the wire: contexts from ``TLS`` values, and failures told as what they mean.

A server's context speaks TLS 1.2 or later only, shows ``cert``, and with
``client_auth`` requires a client certificate signed by ``ca``. A client's
context checks the server's certificate against ``ca`` and the host it
dialled (a name or an IP address, as the certificate's SANs must hold), and
shows ``cert`` when it has one: servers dialling each other (heartbeats,
repair, chains) always show theirs, so mutual TLS needs nothing more.

Failures are ``TLSError`` refusals (``failure``), never transport errors: an
untrusted certificate stays untrusted however often one retries.

Why the server side is more than ``ssl=context``: when asyncio's server fails
a handshake it drops the connection without sending the alert OpenSSL wrote
(so a client lacking a certificate would only see the connection close, and
retry it as lost), and it logs nothing. ``_Watched`` reports the failure and
lets the alert out first (see its docstring).
"""

from __future__ import annotations

import logging
import os
import ssl
from typing import Final

from .._config import TLS
from .._errors import GrabenError, InvalidArgument, NotFound, TLSError, Unavailable

log = logging.getLogger("graben.tls")

HANDSHAKE_TIMEOUT_S: Final = 10.0
"""Longest a TLS handshake may take: what a silent or failed peer can hold a server for."""
ALERT: Final = b"\x15\x03\x01\x00\x02\x02\x46"
"""A TLS record: fatal alert ``protocol_version``, what a peer that does not speak the
other side's protocol is told (TLS clients report it; graben's frames recognise it)."""
TLS_RECORDS: Final = frozenset({0x15, 0x16})
"""First bytes of TLS alert and handshake records (then ``0x03``, the version's major)."""


def looks_like_tls(data: bytearray, start: int, end: int) -> bool:
    """Whether the bytes a peer sent, ``data[start:end]``, start a TLS record (a hello,
    or an alert), not a graben frame."""
    return end - start >= 2 and data[start] in TLS_RECORDS and data[start + 1] == 0x03


def client_context(tls: TLS | ssl.SSLContext) -> ssl.SSLContext:
    """A context to dial servers with: verifies them, shows ``tls.cert`` if given."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _trust(context, tls)
    if tls.cert is not None:
        _show(context, tls)
    return context


def server_context(tls: TLS) -> ssl.SSLContext:
    """A context to serve with: shows ``tls.cert``; asks for clients' certificates
    with ``tls.client_auth``. Handshake failures are logged and their alerts sent."""
    if tls.cert is None:
        raise InvalidArgument("a TLS server needs a certificate and key (--tls-cert, --tls-key)")
    context = _ServerContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.sslobject_class = _Watched
    _show(context, tls)
    if tls.ca is not None:
        _trust(context, tls)
    if tls.client_auth:
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _trust(context: ssl.SSLContext, tls: TLS) -> None:
    if tls.ca is None:
        return  # a client's default context already trusts the system's CAs
    try:
        context.load_verify_locations(cafile=tls.ca)
    except FileNotFoundError:
        raise NotFound("no such TLS CA file", str(tls.ca)) from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise InvalidArgument(f"cannot load the TLS CA file {tls.ca}: {_why(exc)}") from None


def _show(context: ssl.SSLContext, tls: TLS) -> None:
    assert tls.cert is not None
    for path in (tls.cert, tls.key):
        if path is not None and not os.path.exists(path):
            raise NotFound("no such TLS certificate or key file", str(path))
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        files = str(tls.cert) if tls.key is None else f"{tls.cert} and {tls.key}"
        raise InvalidArgument(
            f"cannot load the TLS certificate and key from {files}: {_why(exc)} "
            "(PEM files, the key unencrypted and matching the certificate)"
        ) from None


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason).lower().replace("_", " ") if reason else str(exc)


_UNTRUSTED_CLIENT: Final = frozenset(
    {"TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE", "SSLV3_ALERT_CERTIFICATE_UNKNOWN"}
)


def failure(exc: ssl.SSLError, where: str) -> TLSError:
    """What a client tells its caller when TLS with the server at ``where`` failed."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TLSError(
            f"the TLS certificate of {where} is not trusted ({exc.verify_message}): give the "
            "CA that signed it (--tls-ca, $GRABEN_TLS_CA), and make sure the certificate "
            "names the host dialled"
        )
    reason = str(exc.reason or "")
    if reason == "TLSV1_ALERT_PROTOCOL_VERSION":
        return TLSError(
            f"{where} does not speak TLS (it is a plaintext server, or too old a TLS): "
            "connect without TLS settings (--tls-ca, $GRABEN_TLS_CA), or start it with "
            "--tls-cert and --tls-key"
        )
    if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        return TLSError(
            f"{where} requires a client certificate (mutual TLS): give one signed by the "
            "cluster's CA (--tls-cert and --tls-key, $GRABEN_TLS_CERT and $GRABEN_TLS_KEY)"
        )
    if reason in _UNTRUSTED_CLIENT:
        return TLSError(
            f"{where} does not trust this client's certificate ({_why(exc)}): use one signed "
            "by the cluster's CA"
        )
    return TLSError(f"TLS with {where} failed: {_why(exc)}")


def lost(exc: BaseException, where: str) -> GrabenError:
    """What a client's calls fail with when its connection to ``where`` ends with ``exc``.

    A refusal in TLS (a client certificate the server wants, which TLS 1.3 tells
    only after the handshake; a server answering a plaintext client in TLS) is
    no lost connection: asking again gets the same answer.
    """
    if isinstance(exc, ssl.SSLError):
        return failure(exc, where)
    if isinstance(exc, TLSError):
        return speaks_tls(where)
    return Unavailable(f"connection to {where} lost: {exc}")


def speaks_tls(where: str) -> TLSError:
    """What a plaintext client tells its caller when the server answered in TLS."""
    return TLSError(
        f"{where} speaks TLS and this client does not: give the cluster's CA "
        "(--tls-ca, $GRABEN_TLS_CA)"
    )


class _ServerContext(ssl.SSLContext):
    """A server's context whose TLS objects can reach their outgoing buffer (``_Watched``)."""

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        tls = super().wrap_bio(incoming, outgoing, server_side, server_hostname, session)
        if isinstance(tls, _Watched):
            tls.outgoing = outgoing
        return tls


class _Watched(ssl.SSLObject):
    """A server connection's TLS: a failed handshake is logged, and its alert sent.

    asyncio aborts a connection whose handshake failed before sending what
    OpenSSL wrote for the peer, so the first failure is reported as "want
    more data" instead: asyncio then flushes the alert (or, when OpenSSL wrote
    none, as for a peer speaking plaintext, the ``ALERT`` we add), and the
    next step of the handshake (the peer's next bytes, its close, or the
    handshake timeout) raises the real error and drops the connection.
    """

    outgoing: ssl.MemoryBIO | None = None
    failed: ssl.SSLError | None = None

    def do_handshake(self) -> None:
        if self.failed is not None:
            raise self.failed
        try:
            super().do_handshake()
        except ssl.SSLWantReadError:
            raise
        except ssl.SSLError as exc:
            self.failed = exc
            # The Repeats filter of the CLI's logging keeps a flood of these to one
            # line per interval, with a count.
            log.warning("refused a TLS connection: %s", _why(exc))
            if self.outgoing is None:
                raise
            if not self.outgoing.pending:
                self.outgoing.write(ALERT)
            raise ssl.SSLWantReadError("alert pending") from None
