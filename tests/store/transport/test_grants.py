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
        short = Capability("c2", "read", time.time() + 0.4, "m")  # a tenant's, say
        grants.add([fresh, short])
        assert await grants.get("c1", "read") is fresh
        assert await grants.get("c2", "read") is short  # in the first half of its life
        assert asked == []
        await asyncio.sleep(0.25)
        assert (await grants.get("c2", "read")).mac == "mac"  # past half: fetched anew
        assert (await grants.get("c1", "write")).op == "write"  # never held
        assert asked == [(("c2",), "read"), (("c1",), "write")]

    asyncio.run(scenario())


def test_a_grant_is_renewed_a_margin_before_expiry_or_at_half_its_life() -> None:
    async def fetch(chunks: tuple[str, ...], op: Op) -> list[Capability]:
        return []

    grants, now = Grants(fetch), time.time()
    long, short = Capability("a", "read", now + 600, "m"), Capability("b", "read", now + 10, "m")
    grants.add([long, short])
    assert grants._held[("a", "read")][1] == pytest.approx(long.expires - REFRESH_BEFORE_S, abs=1)
    assert grants._held[("b", "read")][1] == pytest.approx(now + 5, abs=1)


def test_a_grant_that_never_comes_is_a_permission_error() -> None:
    async def fetch(chunks: tuple[str, ...], op: Op) -> list[Capability]:
        return []

    with pytest.raises(PermissionDenied, match="granted no read"):
        asyncio.run(Grants(fetch).get("c", "read"))
