"""Capabilities a client holds for the data nodes: fetched when missing or about to expire."""

from __future__ import annotations

import asyncio
import time

import pytest

from graben.store import PermissionDenied
from graben.store._types import Capability, Op
from graben.store.transport._remote import REFRESH_BEFORE_S, Grants


def test_grants_are_fetched_when_missing_or_about_to_expire() -> None:
    asked: list[tuple[tuple[str, ...], Op]] = []

    async def fetch(chunks: tuple[str, ...], op: Op) -> list[Capability]:
        asked.append((chunks, op))
        return [Capability(c, op, time.time() + 600, "mac") for c in chunks]

    async def scenario() -> None:
        grants = Grants(fetch)
        fresh = Capability("c1", "read", time.time() + 600, "m")
        grants.add([fresh, Capability("c2", "read", time.time() + REFRESH_BEFORE_S / 2, "m")])
        assert await grants.get("c1", "read") is fresh
        assert asked == []
        assert (await grants.get("c2", "read")).mac == "mac"  # stale: fetched anew
        assert (await grants.get("c1", "write")).op == "write"  # never held
        assert asked == [(("c2",), "read"), (("c1",), "write")]

    asyncio.run(scenario())


def test_a_grant_that_never_comes_is_a_permission_error() -> None:
    async def fetch(chunks: tuple[str, ...], op: Op) -> list[Capability]:
        return []

    with pytest.raises(PermissionDenied, match="granted no read"):
        asyncio.run(Grants(fetch).get("c", "read"))
