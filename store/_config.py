"""Client options and the environment, read in this one module (the cluster's
credentials aside: they are read where they are used, in ``wire/_auth.py``).

Precedence, highest first: arguments to ``connect``/``Options`` (``token`` or
``token_file``), then the environment (``GRABEN_URL``, ``GRABEN_HOME``, ``GRABEN_CHUNK_SIZE``, for a
cluster ``GRABEN_TLS_CA`` / ``GRABEN_TLS_CERT`` / ``GRABEN_TLS_KEY`` (``tls_from_env``)
and ``GRABEN_TOKEN``, then ``GRABEN_SECRET`` / ``GRABEN_SECRET_FILE``, read
by ``wire/_auth.py``: ``cluster_token``, ``load_secret``), then the defaults
below. Servers read ``GRABEN_PAGE_ENTRIES`` (``page_entries``) on every page
they serve.

Besides ``Options`` and ``TLS``: where a store is (``resolve``: its URL or
the default home; ``split_url``), where caches go (``cache_home``), the AWS
settings of the dataset door's S3 fetches (``aws_environment``) and of the
servers' S3 tier (``aws_settings``: the shared files too), the key of chunk
files encrypted at rest (``encryption_key_file``), the node's
memory agent (``agent_address``: ``GRABEN_AGENT``), sizes as
people write them (``parse_size``), and the constants that clients and
servers, or a data node and the metadata service's placement, agree on
(chunk sizes, ``PAGE_ENTRIES``, ``RESERVE``).
"""

from __future__ import annotations

import configparser
import os
import re
import ssl
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, unquote, urlsplit

from ._errors import InvalidArgument

MiB = 1 << 20
DEFAULT_CHUNK_SIZE = 8 * MiB
DEFAULT_REPLICA_DEADLINE = 3.0
MAX_CHUNK_SIZE = 256 * MiB
PAGE_ENTRIES = 128
"""Entries in one page of a list-shaped reply (fsck's chunk records, a node's inventory,
collection). A page of chunk records with their read capabilities is ~60 KiB: far
under the wire's header limit (1 MiB, and a receiver's 256 KiB inbox, which a header
must fit); a store of any size is just more pages."""
RESERVE = 64 << 20
"""Bytes a node keeps free beyond the chunk, so a disk stops taking chunks before it fills."""


ENV_SECRET = "GRABEN_SECRET"
"""The cluster secret itself, as text."""
ENV_SECRET_FILE = "GRABEN_SECRET_FILE"
"""A file holding the cluster secret."""
ENV_TOKEN = "GRABEN_TOKEN"
"""A cluster client's token: a tenant's (``graben token create``), or the cluster's own."""
ENV_TOKEN_FILE = "GRABEN_TOKEN_FILE"
"""A file (0600) holding a cluster client's token; ``$GRABEN_TOKEN`` comes first."""
ENV_AGENT = "GRABEN_AGENT"
"""``HOST:PORT`` of this node's memory agent (``graben agent serve``)."""
AGENT_PORT = 7300
"""Where a memory agent listens unless told otherwise."""


def agent_address(given: str | None = None) -> str:
    """The memory agent a rank uses: ``given``, else ``$GRABEN_AGENT``, else this host's
    default (``127.0.0.1:7300``)."""
    return given or env(ENV_AGENT) or f"127.0.0.1:{AGENT_PORT}"


def env(name: str) -> str | None:
    """A variable of the environment, ``None`` if unset or empty: every module asks here,
    so what graben reads from the environment is in this one module (see its docstring
    for each variable's precedence)."""
    return os.environ.get(name) or None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"${name} must be an integer, not {value!r}") from None


def page_entries(asked: int = 0, default: int = PAGE_ENTRIES) -> int:
    """Entries per page: ``asked`` if positive and smaller, else ``$GRABEN_PAGE_ENTRIES``
    (tests lower it to cross many pages), else ``default``."""
    most = _env_int("GRABEN_PAGE_ENTRIES", default)
    if most < 1:
        raise InvalidArgument(f"$GRABEN_PAGE_ENTRIES must be at least 1, not {most}")
    return min(asked, most) if asked > 0 else most


ENV_TLS_CA = "GRABEN_TLS_CA"
ENV_TLS_CERT = "GRABEN_TLS_CERT"
ENV_TLS_KEY = "GRABEN_TLS_KEY"
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
    ca = ca or os.environ.get(ENV_TLS_CA) or None
    cert = cert or os.environ.get(ENV_TLS_CERT) or None
    key = key or os.environ.get(ENV_TLS_KEY) or None
    if ca is None and cert is None and key is None:
        return None
    if key is not None and cert is None:
        raise InvalidArgument(
            f"a TLS key (${ENV_TLS_KEY}, --tls-key) needs its certificate too "
            f"(${ENV_TLS_CERT}, --tls-cert)"
        )
    return TLS(ca=ca, cert=cert, key=key)


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """How a client reads and writes. Every field is keyword-only."""

    chunk_size: int = field(
        default_factory=lambda: _env_int("GRABEN_CHUNK_SIZE", DEFAULT_CHUNK_SIZE)
    )
    """Bytes per chunk for new files."""
    replication: int | None = None
    """Copies of each chunk; ``None`` takes the store's default (1 embedded)."""
    min_replicas: int | None = None
    """Copies a write needs when nodes are down (it goes on with fewer than ``replication``,
    and repair adds the rest); ``None`` takes the cluster's ``--min-replicas``."""
    timeout: float = 30.0
    """Seconds a request keeps retrying while the metadata service is unreachable (cannot
    connect, connection lost, no answer), moving to another of the cluster's services
    if there is one; refusals are never retried. Mutations are repeated with their
    idempotency key (applied once), and for at most 300 s whatever this says."""
    wait: float = 1.0
    """Seconds a client that has never reached the cluster keeps trying (a refused or
    unanswered connection) before it says so: a dead endpoint costs this, not
    ``timeout``. Raise it to wait for a cluster that is starting (``--wait``)."""
    replica_deadline: float = DEFAULT_REPLICA_DEADLINE
    """Seconds a chunk write waits for a data node once another node has its copy. A
    node past it (hung, or its disk dying) is passed over: the write goes on with
    the copies it has if they are at least ``min_replicas``, repair adds the rest,
    and the node is skipped by this client's writes and read last for 15 s."""
    max_inflight: int = 8
    """Chunks one writer hashes and uploads at once."""
    inline_max: int | None = None
    """Largest file this client has the metadata engine keep itself (no data node write:
    one round trip); ``None``: as large as the store keeps (``--inline-max``), 0: none."""
    read_ahead: int = 16
    """Chunks a sequential reader fetches ahead of the one it is on."""
    read_check: Literal["blake3", "crc32c"] = "blake3"
    """What a read from a data node checks: ``"blake3"``, that the bytes hash to the
    chunk's id (a copy damaged or rewritten on a node's disk is refused, reported for
    repair, and another read); ``"crc32c"``, only that they crossed the wire intact.
    An embedded store's own directory is checked by crc32c (and fsck, by blake3)."""
    io_threads: int = 4
    """Threads doing disk I/O for an embedded store."""
    hash_threads: int = 2
    """Threads hashing chunks (blake3, crc32c release the GIL)."""
    remote_read_ahead: int = 0
    """Chunks a sequential reader fetches ahead from a cluster into buffers of its
    own (memory: that many chunks). Measured over loopback on 2 cores it only
    cost (1.1 against 1.7 GB/s); on a real network it hides the round trips."""
    gc_grace_s: float = 3600.0
    """Age before unreferenced chunks, orphan chunk files and writers' temporaries may be
    collected (``fsck(grace=...)`` overrides it for one run)."""
    token: str | None = field(default=None, repr=False)
    """A cluster's client token: a tenant's (``graben token create``) or the cluster's
    own. ``None`` takes ``$GRABEN_TOKEN``, else the file ``$GRABEN_TOKEN_FILE``, else the
    one computed from the cluster secret (``$GRABEN_SECRET_FILE``). Ignored embedded."""
    token_file: FilePath | None = None
    """A file (0600) holding the client token, as ``--token-file`` names one: read when the
    client connects, and taken before ``$GRABEN_TOKEN``. Give this or ``token``, not
    both. Ignored embedded."""
    tls: TLS | ssl.SSLContext | None = field(default_factory=tls_from_env)
    """How to reach a cluster over TLS (a ``TLS``, or a client ``ssl.SSLContext`` of the
    caller's own); ``None``: plaintext. Default: ``$GRABEN_TLS_CA`` and friends, else
    plaintext. The server's name is checked against the host dialled. Ignored embedded."""

    def __post_init__(self) -> None:
        if not 4096 <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise InvalidArgument(
                f"chunk_size must be between 4096 and {MAX_CHUNK_SIZE} bytes, not {self.chunk_size}"
            )
        if self.replication is not None and self.replication < 1:
            raise InvalidArgument(f"replication must be at least 1, not {self.replication}")
        if self.min_replicas is not None and self.min_replicas < 1:
            raise InvalidArgument(f"min_replicas must be at least 1, not {self.min_replicas}")
        for name in ("timeout", "wait", "replica_deadline"):
            if not getattr(self, name) > 0:
                raise InvalidArgument(
                    f"{name} must be a positive number of seconds, not {getattr(self, name)}"
                )
        for name in ("max_inflight", "io_threads", "hash_threads"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be at least 1")
        if self.token is not None and self.token_file is not None:
            raise InvalidArgument("give a token or a token file (token_file=), not both")
        if self.read_check not in ("blake3", "crc32c"):
            raise InvalidArgument(f"read_check is blake3 or crc32c, not {self.read_check!r}")
        if self.read_ahead < 0:
            raise InvalidArgument("read_ahead must not be negative")
        if self.inline_max is not None and self.inline_max < 0:
            raise InvalidArgument(f"inline_max must not be negative, not {self.inline_max}")


AWS_VARIABLES = {
    "key": "AWS_ACCESS_KEY_ID",
    "secret": "AWS_SECRET_ACCESS_KEY",
    "token": "AWS_SESSION_TOKEN",
    "region": "AWS_REGION",
    "endpoint": "AWS_ENDPOINT_URL",
    "profile": "AWS_PROFILE",
}


def aws_environment() -> dict[str, str]:
    """The AWS settings an S3 client takes from the environment (``AWS_REGION``, else
    ``AWS_DEFAULT_REGION``): the dataset door's own S3 client uses them only where
    s3fs would use the same (see ``graben.dataloader``'s ``_s3``)."""
    found = {name: os.environ.get(variable, "") for name, variable in AWS_VARIABLES.items()}
    found["region"] = found["region"] or os.environ.get("AWS_DEFAULT_REGION", "")
    return {name: value for name, value in found.items() if value}


def aws_settings() -> dict[str, str]:
    """The AWS settings a data node's or metadata service's S3 tier uses: the environment
    (``aws_environment``) first, then the shared files, ``$AWS_SHARED_CREDENTIALS_FILE``
    (else ``~/.aws/credentials``) and ``$AWS_CONFIG_FILE`` (else ``~/.aws/config``), in
    the profile ``$AWS_PROFILE`` names, else ``default``. Keys as ``aws_environment``'s."""
    found = aws_environment()
    profile = found.pop("profile", "default")
    home = Path.home() / ".aws"
    shared = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or str(home / "credentials")
    config = os.environ.get("AWS_CONFIG_FILE") or str(home / "config")
    files = {
        **_ini_section(config, profile if profile == "default" else f"profile {profile}"),
        **_ini_section(shared, profile),
    }
    names = {
        "aws_access_key_id": "key",
        "aws_secret_access_key": "secret",
        "aws_session_token": "token",
        "region": "region",
        "endpoint_url": "endpoint",
    }
    from_files = {names[k]: v for k, v in files.items() if k in names and v}
    return {**from_files, **found}


def _ini_section(path: str, section: str) -> dict[str, str]:
    """One section of an INI file (AWS's shared files), empty if either is missing."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error):
        return {}
    return dict(parser[section]) if parser.has_section(section) else {}


def encryption_key_file() -> Path | None:
    """``$GRABEN_ENCRYPTION_KEY_FILE``: the store's key for chunk files encrypted at rest
    (an embedded store's, or a data node's without ``--encryption-key-file``)."""
    found = os.environ.get("GRABEN_ENCRYPTION_KEY_FILE", "")
    return Path(found) if found else None


def cache_home() -> Path:
    """Where graben keeps caches on this machine: ``$XDG_CACHE_HOME/graben`` (an absolute
    ``XDG_CACHE_HOME``), else ``~/.cache/graben``; without a writable home,
    ``$TMPDIR/graben-<uid>``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "graben"
    home = os.path.expanduser("~")
    if os.path.isabs(home) and os.path.isdir(home) and os.access(home, os.W_OK):
        return Path(home) / ".cache" / "graben"
    return Path(tempfile.gettempdir()) / f"graben-{os.geteuid()}"


def default_home() -> Path:
    """``$GRABEN_HOME``, else ``~/.local/share/graben``."""
    home = os.environ.get("GRABEN_HOME")
    return Path(home) if home else Path.home() / ".local" / "share" / "graben"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL points: an embedded directory or a cluster's metadata services."""

    embedded: Path | None = None
    """Root of an embedded store."""
    addresses: tuple[tuple[str, int], ...] = ()
    """(host, port) of each metadata service endpoint, in the order given (the first
    is tried first); a name may stand for several services (all its addresses)."""

    @property
    def address(self) -> tuple[str, int] | None:
        """The first endpoint; ``None`` for an embedded store."""
        return self.addresses[0] if self.addresses else None


def resolve(url: str | os.PathLike[str] | None) -> Target:
    """Turn a ``connect`` argument into a target: a ``graben://HOST:PORT`` URL, a
    directory; ``None`` (or ``graben:///``) for ``$GRABEN_URL``, else the default home."""
    if url is None:
        return _default_target()
    text = os.fspath(url)
    parts = _split(text)
    if parts.scheme in ("", "file"):
        local = unquote(parts.path) if parts.scheme == "file" else text
        if not local:
            raise InvalidArgument(f"no directory in store URL {text!r}")
        return Target(embedded=Path(local).expanduser())
    if parts.scheme != "graben":
        raise InvalidArgument(f"unsupported store URL scheme {parts.scheme!r} in {text!r}")
    if not parts.netloc:
        return _default_target()
    if parts.query or parts.fragment:
        raise InvalidArgument(
            f"not a store URL: {_shown(text)!r} has a query or fragment ('?', '#'), which graben "
            "URLs do not take (graben://host:port/path)"
        )
    return Target(addresses=endpoints(parts.netloc, text))


def _split(text: str) -> SplitResult:
    """``urlsplit``, its errors (an IPv6 address's unclosed bracket) as ``InvalidArgument``
    naming the URL."""
    try:
        return urlsplit(text)
    except ValueError as exc:
        raise InvalidArgument(
            f"not a store URL: {_shown(text)!r} ({exc}: an IPv6 address goes in brackets, "
            "graben://[::1]:7100/path; fsspec splits URLs at '::', its chaining, so there "
            "name the host, or pass the URL as GrabenFileSystem(url=...))"
        ) from None


def _shown(text: str) -> str:
    """A URL as an error may show it: any user part (which may hold a password) elided."""
    return re.sub(r"//[^/]*@", "//...@", text)


def endpoints(hosts: str, text: str) -> tuple[tuple[str, int], ...]:
    """``h1:7100,h2:7100`` (``[v6]:port`` too) as (host, port) pairs, each once, in order;
    ``text`` (the whole URL or flag) names what was wrong."""
    found: dict[tuple[str, int], None] = {}
    for item in hosts.split(","):
        if "@" in item:
            raise InvalidArgument(
                f"not a store URL: the one naming {item.rpartition('@')[2]!r} has a user "
                f"part ('...@'), which graben URLs do not take (not repeated here: it may "
                f"hold a password); a cluster client's credential is its token (token=, "
                f"token_file=, ${ENV_TOKEN}, ${ENV_TOKEN_FILE})"
            )
        try:
            parts = urlsplit(f"//{item.strip()}")
            host, port = parts.hostname, parts.port
        except ValueError as exc:  # urllib's word on a port that is not a number
            raise InvalidArgument(
                f"not a store URL: {item!r} in {text!r} is not host:port ({exc})"
            ) from None
        if not host or port is None:
            raise InvalidArgument(
                f"a cluster URL needs host:port for each metadata service "
                f"(graben://h1:7100,h2:7100/path), not {item!r} in {text!r}; "
                f"the default store is graben:///path, with three slashes (a tool that "
                f"treats URLs as file paths, like Hugging Face streaming, folds them to two)"
            )
        found[(host, port)] = None
    return tuple(found)


def cluster_url(addresses: tuple[tuple[str, int], ...]) -> str:
    """``graben://h1:7100,h2:7100``: the URL of a cluster with these endpoints."""
    return "graben://" + ",".join(
        f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in addresses
    )


def _default_target() -> Target:
    """``$GRABEN_URL`` unless it too names "the default", else embedded at home."""
    env = os.environ.get("GRABEN_URL")
    if env and not env.startswith("graben:///"):
        return resolve(env)
    return Target(embedded=default_home())


_OTHER_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/")
"""Another scheme's URL (``s3://``, ``http://``): never taken for a path in a store."""


def split_url(url: str) -> tuple[str | None, str]:
    """Split a file URL into (store URL, path in the store).

    ``graben://host:port/a/b`` -> ``("graben://host:port", "/a/b")``;
    ``graben:///a/b`` and a bare ``/a/b`` -> ``(None, "/a/b")`` (the default
    store, or whichever the caller names separately).
    """
    parts = _split(url)
    if parts.scheme != "graben":
        if _OTHER_URL.match(url):
            raise InvalidArgument(
                f"{url!r} is not in a graben store: graben takes graben:// URLs and "
                f"paths in a store, not {parts.scheme}: URLs"
            )
        return None, url or "/"
    if not url[len("graben:") :].startswith("//"):
        raise InvalidArgument(
            f"{url!r} is not a graben URL: graben:///path names the default store, "
            "graben://host:port/path a cluster"
        )
    store = f"graben://{parts.netloc}" if parts.netloc else None
    return store, unquote(parts.path) or "/"


# --- sizes as people write them ---------------------------------------------------

_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_SIZE = re.compile(r"\s*(\d+)(?:\.(\d+))?\s*(?:([kmgtp])(?:i?b)?|b)?\s*", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: a plain count (``"4096"``) or a number with a binary unit.

    ``K``, ``M``, ``G``, ``T``, ``P`` (also ``KiB``, ``MB``, ...) are powers of
    1024, as in ``df -h`` and ``dd``: ``"50G"`` is 50 GiB, ``"1.5M"`` 1,572,864.
    Anything else is ``InvalidArgument`` (a ``ValueError``) naming what was given.
    """
    if isinstance(text, int) and text >= 0:
        return text
    match = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidArgument(f"not a size: {text!r} (say 4096, 512K, 256MiB, 50G or 1T)")
    whole, fraction, unit = match.group(1), match.group(2) or "", (match.group(3) or "").lower()
    scale = 1 << (10 * _POWERS[unit])
    tenths: int = 10 ** len(fraction)
    return int(whole) * scale + int(fraction or "0") * scale // tenths
