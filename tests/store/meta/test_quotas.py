"""Quotas of directories on both engines: usage moved by each write's transaction, a
write past a limit refused whole, a rm giving back, moves across quotas refused."""

from __future__ import annotations

import errno

import pytest
from pg_kit import Engine, chunk, file

from graben.store import CrossDevice, NotFound, QuotaExceeded
from graben.store.meta import Metadata

BIG = 100_000
"""A chunk kept on nodes (over the 64 KiB kept in the engine): on disk once per copy."""


def usage(ns: Metadata, path: str) -> tuple[int, int, int]:
    (quota,) = [q for q in ns.quotas.quotas_of(path) if q.path == path]
    return quota.files, quota.bytes, quota.physical


def test_usage_follows_commits_replacements_and_removals(engine: Engine) -> None:
    ns = Metadata(engine.open(), default_replication=3)
    ns.namespace.mkdir("/q")
    ns.commits.commit((file("/q/before", [chunk(1, BIG)]),))
    ns.quotas.set_quota("/q", 10 * BIG, 0, 0)  # counts what is there already
    assert usage(ns, "/q") == (1, BIG, 3 * BIG)
    ns.commits.commit(
        (file("/q/d/a", [chunk(2, BIG), chunk(3, BIG)]), file("/q/small", [chunk(4, 10)]))
    )
    assert usage(ns, "/q") == (3, 3 * BIG + 10, 9 * BIG + 10)  # the small one kept once
    ns.commits.commit((file("/q/d/a", [chunk(2, BIG)]),))  # replaced: its old version given back
    assert usage(ns, "/q") == (3, 2 * BIG + 10, 6 * BIG + 10)
    ns.commits.commit(
        (file("/q/dup", [chunk(1, BIG)]),)
    )  # the same bytes as /q/before: charged too
    assert usage(ns, "/q")[1] == 3 * BIG + 10
    ns.namespace.remove("/q/d", recursive=True)
    ns.namespace.remove("/q/small")
    assert usage(ns, "/q") == (2, 2 * BIG, 6 * BIG)


def test_a_write_past_a_limit_is_refused_whole(engine: Engine) -> None:
    ns = Metadata(engine.open(), default_replication=2)
    ns.namespace.mkdir("/q")
    ns.namespace.mkdir("/q/inner")
    ns.quotas.set_quota("/q", 3 * BIG, 0, 0)
    ns.quotas.set_quota("/q/inner", 0, 0, 2)
    ns.commits.commit((file("/q/inner/1", [chunk(1, BIG)]), file("/q/inner/2", [chunk(2, BIG)])))
    with pytest.raises(QuotaExceeded, match="the quota of /q/inner allows 2 files") as refused:
        ns.commits.commit((file("/q/inner/3", [chunk(3, 10)]),))
    assert refused.value.errno == errno.EDQUOT
    with pytest.raises(QuotaExceeded, match="allows 300,000 bytes"):
        ns.commits.commit((file("/q/x", [chunk(4, BIG)]), file("/q/y", [chunk(5, BIG)])))
    with pytest.raises(NotFound):  # neither file of the refused commit is there
        ns.namespace.stat("/q/x")
    assert usage(ns, "/q") == (2, 2 * BIG, 4 * BIG)
    with pytest.raises(QuotaExceeded):  # before the chunk is sent: the file's bytes so far
        ns.commits.prepare((chunk(6, BIG),), 0, paths=("/q/z",), sent=(BIG,))
    ns.commits.prepare((chunk(6, BIG),), 0, paths=("/q/z",), sent=(0,))


def test_moves_stay_within_their_quotas_and_take_theirs_along(engine: Engine) -> None:
    ns = Metadata(engine.open())
    for d in ("/a", "/b", "/a/job"):
        ns.namespace.mkdir(d)
    ns.quotas.set_quota("/a", BIG * 10, 0, 0)
    ns.quotas.set_quota("/a/job", BIG * 5, 0, 0)
    ns.commits.commit((file("/a/job/x", [chunk(1, BIG)]), file("/a/y", [chunk(2, BIG)])))
    ns.namespace.rename("/a/y", "/a/z")  # within /a: fine
    with pytest.raises(CrossDevice) as across:
        ns.namespace.rename("/a/z", "/b/z")
    assert across.value.errno == errno.EXDEV
    with pytest.raises(CrossDevice):
        ns.namespace.link("/a/job/x", "/a/x")  # out of /a/job
    ns.namespace.rename("/a/job", "/a/run")  # a directory with its own quota moves with it
    assert [q.path for q in ns.quotas.quotas_of("/a")] == ["/a", "/a/run"]
    assert usage(ns, "/a/run") == (1, BIG, BIG)
    ns.namespace.remove("/a/run", recursive=True)  # its quota goes with it, /a gets its bytes back
    assert [q.path for q in ns.quotas.quotas_of("/a")] == ["/a"]
    assert usage(ns, "/a") == (1, BIG, BIG)
    ns.quotas.set_quota("/a", 0, 0, 0)  # clear
    assert ns.quotas.quotas_of("") == []
