"""The sync API is the async one: a method or a parameter on one side only fails here."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from graben.store import (
    AsyncClient,
    AsyncReadFile,
    AsyncWriteFile,
    Client,
    ReadFile,
    WriteFile,
    connect,
)

BRIDGE = {"aio", "submit", "wrap"}
"""Sync only: how sync code reaches the ``AsyncClient`` underneath (a trio daemon, tests)."""


def public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def parameters(cls: type, name: str) -> list[tuple[str, Any, Any]]:
    """A method's parameters after ``self``: name, kind and default."""
    found = inspect.getattr_static(cls, name)
    if isinstance(found, property):
        return [("<property>", None, None)]
    if isinstance(found, classmethod):
        found = found.__func__
    listed = list(inspect.signature(found).parameters.values())[1:]
    return [(p.name, p.kind, p.default) for p in listed]


def test_the_sync_client_has_every_async_method_with_the_same_parameters() -> None:
    assert public(Client) - BRIDGE == public(AsyncClient)
    for name in sorted(public(AsyncClient)):
        assert parameters(Client, name) == parameters(AsyncClient, name), name


@pytest.mark.parametrize(("sync", "aio"), [(WriteFile, AsyncWriteFile), (ReadFile, AsyncReadFile)])
def test_the_file_objects_have_the_same_methods(sync: type, aio: type) -> None:
    # A sync file is also an io object (readable, fileno, ...): every async file's
    # method is on it, and every method it adds of its own is on the async one.
    own = {name for name in vars(sync) if not name.startswith("_")} - {"info"}
    assert own <= public(aio)
    for name in sorted(public(aio) - {"info", "name", "closed", "mode", "upload"}):
        assert callable(getattr(sync, name)), name
        try:
            theirs = [(p, default) for p, _, default in parameters(sync, name)]
        except ValueError:  # an io method in C without a signature (tell, close)
            continue
        ours = [(p, default) for p, _, default in parameters(aio, name)]
        if sync is ReadFile:  # io's own names for the same arguments
            theirs = [({"target": "offset"}.get(p, p), d) for p, d in theirs]
        assert theirs == ours, name


def test_a_file_opened_without_autocommit_is_published_by_commit_or_dropped(
    tmp_path: Path,
) -> None:
    with connect(tmp_path / "store") as client:
        kept = client.open("/kept", "wb", autocommit=False)
        kept.write(b"kept")
        kept.close()  # uploaded, not yet visible
        dropped = client.open("/dropped", "wb", autocommit=False)
        dropped.write(b"dropped")
        dropped.close()
        assert not client.exists("/kept")
        assert kept.commit().size == 4
        dropped.discard()
        assert client.get("/kept") == b"kept"
        assert not client.exists("/dropped")


def test_the_async_file_commits_and_discards_the_same_way(tmp_path: Path) -> None:
    asyncio.run(commit_and_discard(tmp_path / "store"))


async def commit_and_discard(store: Path) -> None:
    async with AsyncClient(store) as client:
        async with client.open("/a", "wb", autocommit=False) as a:
            await a.write(b"a")
        async with client.open("/b", "wb", autocommit=False) as b:
            await b.write(b"b")
        assert a.info is None and not await client.exists("/a")
        await client.commit_uploads([a.upload])
        await b.discard()
        assert await client.get("/a") == b"a"
        assert not await client.exists("/b")
        assert a.seek(0, 1) == 1
