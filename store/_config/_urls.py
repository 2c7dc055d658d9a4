"""Where a store is: a ``connect`` argument or file URL resolved (``resolve``,
``split_url``), a cluster's endpoints and its URL, the default store's home."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit

from .._errors import InvalidArgument
from ._env import ENV_HOME, ENV_TOKEN, ENV_TOKEN_FILE, ENV_URL, env


def default_home() -> Path:
    """``$GRABEN_HOME``, else ``~/.local/share/graben``."""
    home = env(ENV_HOME)
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
    given = env(ENV_URL)
    if given and not given.startswith("graben:///"):
        return resolve(given)
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
