"""The cluster's auth primitives: one shared secret, client tokens, chunk capabilities.

Every process of a cluster holds the same secret. A client proves it holds it
with a token (an HMAC of a fixed label), which the metadata service checks.
The metadata service then grants short-lived capabilities, each an HMAC over
(chunk id, op, expiry), which a data node checks on its own: no call back to
the metadata service on the data path.

Everything here is pure except ``load_secret``, which reads a file and the
environment. The clock is an argument (``now``), so expiry is tested with
plain numbers. Typical use::

    secret = load_secret()                              # every process, once
    check_token(secret, call.token)                     # metadata service
    cap = grant(secret, chunk, "write", ttl_s, now)     # metadata service
    check(secret, cap, chunk, "write", now)             # data node

The secret is taken verbatim, as bytes of the stripped text: a hex secret
(what ``new_secret`` makes) is not hex-decoded, so the same text in a file or
in ``$GRABEN_SECRET`` always yields the same key, with no guessing at whether
a text "looks like hex".
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import os
import secrets
import stat
from pathlib import Path
from typing import Final

import msgspec

from .._config import ENV_SECRET, ENV_SECRET_FILE, ENV_TOKEN, ENV_TOKEN_FILE, env
from .._errors import InvalidArgument, PermissionDenied, from_os_error
from .._types import OPS, Capability, Op, Receipt

MIN_SECRET: Final = 16
"""Fewest bytes a secret may have: 128 bits, if it is random."""
MAX_SECRET: Final = 4096
"""Most bytes read from a secret file, so a wrong path (``/dev/zero``) fails fast."""

# Distinct labels, and distinct encodings (raw bytes vs a msgpack array), keep a
# token from ever being mistaken for a capability's MAC and vice versa. Bump the
# version if either encoding changes, so old MACs stop verifying.
_TOKEN_LABEL: Final = b"graben client token v1"
_CAPABILITY_LABEL: Final = "graben capability v1"
_RECEIPT_LABEL: Final = "graben receipt v1"
RECEIPT_TTL_S: Final = 86400.0
"""How long a node's receipt proves its writer held a chunk's bytes: a file may stay
open for hours between a write and its commit."""
GRANT_TTL_S: Final = 600.0
"""How long the metadata service's capabilities last: long enough for any one
chunk transfer and for clocks a little apart, short enough that a leaked one
soon stops working. Clients ask for fresh ones as they run out."""
_BAD_TOKEN: Final = (
    "invalid or missing token: give the client the cluster's secret "
    f"(${ENV_SECRET_FILE}) or a token (${ENV_TOKEN}, ${ENV_TOKEN_FILE})"
)


def load_secret(path: str | Path | None = None) -> bytes:
    """The cluster secret, from the first of these that is given.

    Precedence: ``path``, then ``$GRABEN_SECRET`` (the secret as text), then
    ``$GRABEN_SECRET_FILE``. An empty variable counts as unset. Surrounding
    whitespace is stripped. Raises ``InvalidArgument`` if none is given, the
    secret is empty or shorter than 16 bytes, or its file is a regular file
    that group or others may access (as ssh refuses an exposed private key).
    """
    if path is not None:
        return _read_secret_file(Path(path))
    if text := env(ENV_SECRET):
        return _checked_secret(os.fsencode(text).strip(), f"${ENV_SECRET}")
    if file := env(ENV_SECRET_FILE):
        return _read_secret_file(Path(file))
    raise InvalidArgument(
        f"no cluster secret: pass a secret file, or set ${ENV_SECRET} or ${ENV_SECRET_FILE}"
    )


def cluster_token(given: str | None) -> str:
    """The token a cluster client presents (see ``Options.token``); ``""`` if none is known.

    The metadata service refuses an empty token with a message saying what to set.
    """
    if given is not None:
        return given
    if token := env(ENV_TOKEN):
        return token
    if file := env(ENV_TOKEN_FILE):
        return read_token_file(file)
    if not (env(ENV_SECRET) or env(ENV_SECRET_FILE)):
        return ""
    return client_token(load_secret())


def read_token_file(path: str | Path) -> str:
    """A token kept in a file (``--token-file``, ``$GRABEN_TOKEN_FILE``): its stripped text,
    refused if group or others may read it, or if it is empty."""
    data = _read_private(Path(path), "token")
    text = data.strip().decode("ascii", "replace")
    if not text or len(data) > MAX_SECRET:
        raise InvalidArgument(f"token file {path} holds no token")
    return text


def new_secret() -> str:
    """A fresh random secret (256 bits as hex), to be written into a 0600 file."""
    return secrets.token_hex(32)


@functools.cache  # every call a server receives is checked against it
def client_token(secret: bytes) -> str:
    """The token a client presents: anyone holding the secret can compute it."""
    return hmac.new(_key(secret), _TOKEN_LABEL, hashlib.sha256).hexdigest()


def is_client_token(secret: bytes, token: str) -> bool:
    """Whether ``token`` is the secret's client token (compared in constant time)."""
    return _same(token, client_token(secret))


def check_token(secret: bytes, token: str) -> None:
    """Raise ``PermissionDenied`` unless ``token`` is the secret's client token."""
    if not is_client_token(secret, token):
        raise PermissionDenied(_BAD_TOKEN)


def grant(
    secret: bytes, chunk: str, op: Op, ttl_s: float, now: float, *, store: str = ""
) -> Capability:
    """A capability for ``op`` on ``chunk``, valid from ``now`` for ``ttl_s`` seconds,
    bound to the store with id ``store``."""
    if op not in OPS:
        raise InvalidArgument(f"op must be one of {', '.join(OPS)}, not {op!r}")
    if not (math.isfinite(ttl_s) and ttl_s > 0):
        raise InvalidArgument(f"ttl_s must be a positive number of seconds, not {ttl_s!r}")
    # float(): an int expiry would be MACed as a msgpack int, then arrive as a
    # float after a trip through a float-typed wire field and no longer verify.
    expires = float(now + ttl_s)
    if not math.isfinite(expires):
        raise InvalidArgument(f"now must be finite unix seconds, not {now!r}")
    mac = _capability_mac(_key(secret), chunk, op, expires, store)
    return Capability(chunk, op, expires, mac, store)


def check(
    secret: bytes, cap: Capability, chunk: str, op: str, now: float, *, store: str | None = None
) -> None:
    """Raise ``PermissionDenied`` unless ``cap`` allows ``op`` on ``chunk`` at ``now``
    (and, when ``store`` is given, was granted for that store).

    The MAC is checked first, so nothing of a forged capability is trusted,
    and a tampered field reads as "forged" whatever else is wrong with it.
    """
    mac = _capability_mac(_key(secret), cap.chunk, cap.op, cap.expires, cap.store)
    if not _same(cap.mac, mac):
        raise PermissionDenied("capability is forged or corrupt (bad mac)")
    # Written as "not before" so a NaN ``now`` fails closed.
    if not now < cap.expires:
        raise PermissionDenied(f"capability expired {now - cap.expires:.3f}s ago")
    if cap.chunk != chunk:
        raise PermissionDenied(f"capability is for another chunk ({cap.chunk!r}, not {chunk!r})")
    if cap.op != op:
        raise PermissionDenied(f"capability is for another op ({cap.op!r}, not {op!r})")
    if store is not None and cap.store != store:
        raise PermissionDenied(
            f"capability is for another store ({cap.store or 'none'!r}, not {store!r}): "
            "this data node belongs to another cluster's metadata"
        )


def receipt(secret: bytes, chunk: str, node: str, now: float, *, store: str = "") -> Receipt:
    """A data node's receipt: ``node`` stored the bytes of ``chunk`` (checked) at ``now``."""
    expires = float(now + RECEIPT_TTL_S)
    mac = _receipt_mac(_key(secret), chunk, node, expires, store)
    return Receipt(chunk, node, expires, mac, store)


def check_receipt(
    secret: bytes, given: Receipt, chunk: str, node: str, now: float, *, store: str
) -> None:
    """Raise ``PermissionDenied`` unless ``given`` is a node's receipt for ``chunk`` on
    ``node`` in ``store``, still valid at ``now``. A receipt's MAC differs from any
    capability's (its own label): no capability reads as a receipt, nor the reverse."""
    mac = _receipt_mac(_key(secret), given.chunk, given.node, given.expires, given.store)
    if not _same(given.mac, mac):
        raise PermissionDenied(f"the receipt for chunk {chunk} is forged or corrupt (bad mac)")
    if not now < given.expires:
        raise PermissionDenied(f"the receipt for chunk {chunk} expired")
    if (given.chunk, given.node, given.store) != (chunk, node, store):
        raise PermissionDenied(
            f"the receipt for chunk {chunk} on node {node} is for chunk {given.chunk} on "
            f"node {given.node} of store {given.store or 'none'}"
        )


def _receipt_mac(key: bytes, chunk: str, node: str, expires: float, store: str) -> str:
    message = msgspec.msgpack.encode((_RECEIPT_LABEL, chunk, node, float(expires), store))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _capability_message(chunk: str, op: str, expires: float, store: str = "") -> bytes:
    """What a capability's MAC covers: a msgpack array, so no field can run into the next.

    A store id, when there is one, is a fifth element: arrays of different
    lengths never encode alike, so an unbound capability keeps its old MAC.
    """
    fields: tuple[object, ...] = (_CAPABILITY_LABEL, chunk, op, float(expires))
    return msgspec.msgpack.encode((*fields, store) if store else fields)


def _capability_mac(key: bytes, chunk: str, op: str, expires: float, store: str = "") -> str:
    message = _capability_message(chunk, op, expires, store)
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def _key(secret: bytes) -> bytes:
    """The secret, refused if too short: an empty key would let anyone sign."""
    if len(secret) < MIN_SECRET:
        raise InvalidArgument(f"the cluster secret must be at least {MIN_SECRET} bytes")
    return secret


def _same(given: str, expected: str) -> bool:
    """Constant-time equality of a caller's string with ours."""
    # compare_digest refuses non-ASCII str; encoding (surrogates too) turns any
    # such input into a plain mismatch instead of a TypeError.
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


def _read_secret_file(path: Path) -> bytes:
    return _checked_secret(_read_private(path, "secret").strip(), str(path))


def _read_private(path: Path, what: str) -> bytes:
    """A credential file's first ``MAX_SECRET + 1`` bytes, refused if others may read it."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            data = f.read(MAX_SECRET + 1)
    except OSError as exc:
        raise from_os_error(exc, str(path)) from None
    # Checked on the opened file (fstat), so a swap after a stat cannot slip by.
    _refuse_exposed(path, mode, what)
    return data


def _refuse_exposed(path: Path, mode: int, what: str) -> None:
    """Refuse a regular file that group or others may access, as ssh does.

    Pipes and devices (``<(cmd)``, ``/dev/stdin``) carry no meaningful mode and pass.
    """
    if stat.S_ISREG(mode) and mode & 0o077:
        raise InvalidArgument(
            f"{what} file {path} is accessible by group or others "
            f"(mode {stat.S_IMODE(mode):04o}); run: chmod 600 {path}"
        )


def _checked_secret(secret: bytes, where: str) -> bytes:
    if not secret:
        raise InvalidArgument(f"the cluster secret in {where} is empty")
    if len(secret) < MIN_SECRET:
        raise InvalidArgument(
            f"the cluster secret in {where} is {len(secret)} bytes, too short: "
            f"it needs at least {MIN_SECRET} (graben cluster up makes one)"
        )
    if len(secret) > MAX_SECRET:
        raise InvalidArgument(f"the cluster secret in {where} is over {MAX_SECRET} bytes")
    return secret
