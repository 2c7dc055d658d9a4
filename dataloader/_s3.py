"""Shard fetches from S3 through obstore, where it can stand in for s3fs.

A cold epoch from S3 spends its time fetching shards in ranges. obstore (a
Rust client that releases the GIL) fetched 8 MiB ranges from moto's server
at twice s3fs's speed here (~800 against ~400 MiB/s), so the node cache
fills through it when it is installed (``pip install graben[s3]``) and the
dataset's ``storage_options`` say all it needs: the same keys, endpoint and
region s3fs would use. Anything else (a profile, options it does not know,
no region) keeps s3fs, which reads the manifest in every case.

obstore's threads do not survive a fork: a process forked from one that has
fetched through obstore (a DataLoader worker of a loop that read in its own
process first) fetches through s3fs; a fresh or spawned one uses obstore.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from graben.store import NotFound, aws_environment

RangeFetch = Callable[[str, int, int], memoryview]
"""``fetch(name, start, end)``: bytes ``[start, end)`` of the dataset's file ``name``."""
IGNORED = frozenset({"skip_instance_cache", "use_listings_cache", "listings_expiry_time"})
"""s3fs options about its own caches: nothing for the fetches."""


_started_in: list[int] = []
"""The process whose obstore has fetched, once one has (its runtime's threads live
there only; a fork inherits this, not them)."""


def native_fetch(url: str, options: dict[str, Any]) -> RangeFetch | None:
    """A fetch through obstore for the dataset at ``url``, or ``None`` where s3fs must
    do it (decide again after a fork)."""
    if not url.startswith("s3://") or _started_in[:1] not in ([], [os.getpid()]):
        return None
    try:
        import obstore  # noqa: F401  (the optional client: absent, s3fs does the fetches)
    except ImportError:
        return None
    config = _config(options)
    if config is None:
        return None
    bucket, _, prefix = url[len("s3://") :].partition("/")
    return _Fetch(bucket, prefix.strip("/"), config)


def _config(options: dict[str, Any]) -> dict[str, Any] | None:
    """obstore's S3 settings for s3fs's ``options`` (and the AWS environment), or
    ``None`` if they say something obstore would not do the same way."""
    options = {k: v for k, v in options.items() if k not in IGNORED}
    client = dict(options.pop("client_kwargs", None) or {})
    endpoint = options.pop("endpoint_url", None) or client.pop("endpoint_url", None)
    region = client.pop("region_name", None)
    anonymous = bool(options.pop("anon", False))
    key, secret = options.pop("key", None), options.pop("secret", None)
    token = options.pop("token", None)
    env = aws_environment()
    if options or client or "profile" in env or (key is None) != (secret is None):
        return None  # more than obstore is told here: s3fs knows what it means
    if key is None and not anonymous:
        if "key" not in env or "secret" not in env:
            return None  # credentials from files or the instance: s3fs's chain finds them
        key, secret, token = env["key"], env["secret"], env.get("token")
    region = region or env.get("region")
    endpoint = endpoint or env.get("endpoint")
    if region is None:
        return None  # s3fs asks the bucket where it lives
    config: dict[str, Any] = {"region": region}
    if anonymous:
        config["skip_signature"] = True
    else:
        config.update(access_key_id=key, secret_access_key=secret)
        if token:
            config["session_token"] = token
    if endpoint:
        config["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            config["client_options"] = {"allow_http": True}
    return config


class _Fetch:
    """Ranges of the files under one prefix of a bucket, through one obstore store."""

    def __init__(self, bucket: str, prefix: str, config: dict[str, Any]) -> None:
        from obstore.store import S3Store

        self.bucket, self.prefix = bucket, prefix
        self.store = S3Store(bucket, **config)

    def __call__(self, name: str, start: int, end: int) -> memoryview:
        import obstore

        if not _started_in:
            _started_in.append(os.getpid())
        store, key = self.store, f"{self.prefix}/{name}" if self.prefix else name
        try:
            return memoryview(obstore.get_range(store, key, start=start, end=end))
        except (FileNotFoundError, obstore.exceptions.NotFoundError):
            raise NotFound("no such object", f"s3://{self.bucket}/{key}") from None
        except obstore.exceptions.BaseError:
            # A range past the object's end fails where s3fs returned it short:
            # then what there is, and the cache finds it short of the manifest.
            size = int(obstore.head(store, key)["size"])
            if size >= end:
                raise
            if size <= start:
                return memoryview(b"")
            return memoryview(obstore.get_range(store, key, start=start, end=size))
