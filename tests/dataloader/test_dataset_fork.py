"""DataLoader workers after the parent used the dataset: each worker connects anew."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data

from graben.dataloader import CachedDataset, write_dataset
from graben.store import GrabenFileSystem

N = 203  # 11 shards of 20: a peek fetches a few, the workers fetch the rest


def _listed(batch: list[Any]) -> list[Any]:
    return batch


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One default store for the module: a forkserver keeps the environment it started in."""
    with pytest.MonkeyPatch.context() as patch:
        home = tmp_path_factory.mktemp("home")
        patch.setenv("GRABEN_HOME", str(home))
        patch.delenv("GRABEN_URL", raising=False)
        _forget_default_stores()  # an earlier test's default store may be cached
        yield home
        _forget_default_stores()


def _forget_default_stores() -> None:
    """Drop fsspec's cached filesystems (and their clients), whichever store they opened."""
    for fs in list(GrabenFileSystem._cache.values()):
        fs.client.close()
    GrabenFileSystem.clear_instance_cache()


@pytest.fixture(params=["embedded", "cluster"])
def url(request: pytest.FixtureRequest, home: Path) -> str:
    """A dataset on the default embedded store (``graben:///``) or on a cluster."""
    base = "graben://" if request.param == "embedded" else request.getfixturevalue("cluster_url")
    url = f"{base}/fork-{uuid.uuid4().hex[:8]}"
    write_dataset(url, [{"id": i} for i in range(N)], rows_per_shard=20, rows_per_group=7)
    return url


@pytest.mark.parametrize("start", ["fork", "forkserver", "spawn"])
@pytest.mark.parametrize("used", ["peek", "eval"])
def test_workers_read_every_sample_once_after_the_parent_read(
    url: str, tmp_path: Path, start: str, used: str
) -> None:
    ds = CachedDataset(url, cache_dir=tmp_path / "cache", seed=1)
    if used == "peek":
        samples = iter(ds)
        next(samples)  # one sample: the parent's client is connected and its shard cached
        samples.close()  # type: ignore[attr-defined]
    else:
        eval_loader = torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=_listed)
        for seen, _ in enumerate(eval_loader):  # a short eval pass, without workers
            if seen == 2:
                break
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=8,
        num_workers=2,
        multiprocessing_context=start,
        timeout=30,  # a deadlocked worker fails the test, not the session
        collate_fn=_listed,
    )
    ids = [int(sample["id"]) for batch in loader for sample in batch]
    assert sorted(ids) == list(range(N))
