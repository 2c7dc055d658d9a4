"""Store URLs as ``GrabenFileSystem`` takes and gives them, and the routing of calls.

A path is a store path (``/a/b``) or a URL naming its store too
(``graben://host:port/a/b``, ``graben://h1:7100,h2:7100/a/b`` for a cluster with
several metadata services; ``graben:///a/b`` for the default store).
``route_every_store_path`` wraps each method of the filesystem that takes
store paths so that a call naming another store goes to that store's
filesystem; the helpers below split URLs and name results in the form they
were asked in.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from fsspec.utils import stringify_path

from .. import _config
from .._config import Target

PROTOCOL = "graben"
PREFIX = f"{PROTOCOL}://"
_ENDPOINT = r"(?:\[[0-9A-Fa-f:.]+\]|[^/:,\[\]]+):\d+"
_AUTHORITY = re.compile(rf"{_ENDPOINT}(?:,{_ENDPOINT})*")
"""A cluster's endpoints as a URL names them: ``host:port`` or ``h1:7100,h2:7100``."""
_STORE_PATHS = frozenset({"path", "path1", "path2", "rpath", "paths", "fn", "root"})
"""Parameters of fsspec's methods that hold store paths (``lpath`` is a local one)."""


class Routed(Protocol):
    """A filesystem whose calls are routed: it finds the store its arguments name."""

    def _store_of(self, values: list[Any]) -> Any:
        """The filesystem of the one store that ``values`` name."""


def route_every_store_path(cls: type[Any]) -> None:
    """Wrap every method of ``cls`` (its own and fsspec's) that takes a store path.

    Enumerated, not listed, so a method a newer fsspec adds is covered too.
    """
    for name in dir(cls):
        member = inspect.getattr_static(cls, name)
        if name.startswith("__") or not inspect.isfunction(member):
            continue  # static and class methods take no instance to route from
        parameters = list(inspect.signature(member).parameters)[1:]
        where = {p: i for i, p in enumerate(parameters) if p in _STORE_PATHS}
        if where:
            setattr(cls, name, _routed(name, member, where))


def _routed(name: str, method: Callable[..., Any], where: dict[str, int]) -> Callable[..., Any]:
    """``method``, sent to the filesystem of the store its path arguments name."""

    @functools.wraps(method)
    def call(self: Routed, *args: Any, **kwargs: Any) -> Any:
        given = [
            kwargs[p] if p in kwargs else args[i]
            for p, i in where.items()
            if p in kwargs or i < len(args)
        ]
        fs = self._store_of(given)
        if fs is self:
            return method(self, *args, **kwargs)
        return getattr(fs, name)(*args, **kwargs)

    return call


def split(path: str) -> tuple[str | None, str]:
    """A path's store and its path in that store, in the form it was given.

    ``graben://h:p/a/b`` -> ``("graben://h:p", "/a/b")``; ``graben:///a`` ->
    ``("graben://", "/a")``; ``h:p/a/b``, the form ``_strip_protocol`` gives, ->
    ``("h:p", "/a/b")``; a store path -> ``(None, path)``.
    """
    if path.startswith(PREFIX):
        slash = path.find("/", len(PREFIX))
        return (path, "/") if slash < 0 else (path[:slash], path[slash:])
    if (authority := _AUTHORITY.match(path)) and path[authority.end() :][:1] in ("", "/"):
        return authority.group(), path[authority.end() :] or "/"
    return None, path


def store_path(path: str | os.PathLike[str]) -> str:
    """The path inside its store of any form of ``path``: ``/a/b``."""
    base, local = split(stringify_path(path))
    if base is None and local.startswith(f"{PROTOCOL}:"):
        local = local[len(PROTOCOL) + 1 :]
    return "/" + local.strip("/")


def stripped(path: str) -> str:
    """fsspec's form of a path: a cluster's ``host:port/a/b``, else ``/a/b``.

    The cluster's endpoints stay, as an S3 path keeps its bucket: fsspec users
    (Hugging Face ``datasets``, say) make a URL of a name by putting
    ``graben://`` in front of it, and that URL must name the same store.
    """
    base, _ = split(path)
    local = store_path(path)
    if base is None or base == PREFIX:
        return local
    return base.removeprefix(PREFIX) + local


def full(base: str) -> str:
    """A base as ``split`` gives it, as a URL: ``h:p`` -> ``graben://h:p``."""
    return base if base.startswith(PREFIX) else PREFIX + base


def bases(values: list[Any]) -> Iterator[str | None]:
    """The URL base of every path in ``values`` (``None`` for a store path)."""
    for value in values:
        if isinstance(value, str | os.PathLike):
            base = split(stringify_path(value))[0]
            yield None if base is None else full(base)
        elif isinstance(value, list | tuple | set | dict):  # a dict: pipe's {path: data}
            yield from bases(list(value))


def named(base: str | None, name: str) -> str:
    return name if base is None else base + name


def all_named(base: str | None, found: Any) -> Any:
    """find's or glob's answer (names, or names to entries) with each name under ``base``."""
    if base is None:
        return found
    if isinstance(found, dict):
        return {base + k: _renamed(v, base) for k, v in found.items()}
    return [base + name for name in found]


def _renamed(value: Any, base: str) -> Any:
    if isinstance(value, dict) and "name" in value:
        return {**value, "name": base + value["name"]}
    return value  # cat's data, or the error it met


def label(base: str) -> str:
    return "graben:/// (the default store)" if base == PREFIX else full(base)


def resolve(base: str) -> Target:
    """The store a base names (``InvalidArgument`` naming what is wrong with it)."""
    return _config.resolve(full(base))


def url_of(target: Target) -> str:
    """A URL ``connect`` takes for ``target``: ``graben://host:port`` (every endpoint,
    ``graben://h1:7100,h2:7100``), or the directory."""
    if not target.addresses:
        return str(target.embedded)
    return _config.cluster_url(target.addresses)
