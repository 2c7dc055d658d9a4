"""The S3 tier's bucket: chunks of class ``s3`` kept as one object each, named by id.

The leading metadata service uploads a chunk when it converts it; data nodes
read it through on a miss, into their cache. Both reach the bucket through
obstore (a Rust client; its calls leave the GIL), with the AWS settings of
``_config.aws_settings`` (environment, then the shared files). obstore is
the ``s3`` extra: a server given ``--s3-tier`` without it refuses to start,
naming the extra. A bucket that does not answer fails a call within
``CALL_S`` (two retries inside it), as ``Unavailable``: the reader tries its
other node, the leader the next round.

Object names: ``PREFIX/ab/<chunk id>`` (two hex digits of fan-out spread the
keys over S3's partitions).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from .._config import aws_settings
from .._errors import IntegrityError, InvalidArgument, MissingExtra, NotFound, Unavailable
from .._hashing import content_id, crc32c
from .._types import ChunkRef

CALL_S = 20.0
"""Seconds one call to the bucket may take, retries included."""
_OPTIONS = {
    "key": "access_key_id",
    "secret": "secret_access_key",
    "token": "session_token",
    "region": "region",
    "endpoint": "endpoint",
}


class Bucket:
    """Chunks as objects under one ``s3://BUCKET/PREFIX``."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
            raise InvalidArgument(f"the S3 tier is an s3://BUCKET/PREFIX URL, not {url!r}")
        try:
            from obstore.store import S3Store
        except ImportError:
            raise MissingExtra("the S3 tier needs obstore: pip install 'graben[s3]'") from None
        self.url = url.rstrip("/")
        self.prefix = parts.path.strip("/")
        settings = aws_settings()
        config: dict[str, Any] = {_OPTIONS[k]: v for k, v in settings.items() if k in _OPTIONS}
        config.setdefault("region", "us-east-1")
        client = {
            "allow_http": config.get("endpoint", "").startswith("http://"),
            "connect_timeout": timedelta(seconds=5),
            "timeout": timedelta(seconds=CALL_S),
        }
        retry = {"max_retries": 2, "retry_timeout": timedelta(seconds=CALL_S)}
        self._store = S3Store(
            parts.netloc,
            client_options=client,  # type: ignore[arg-type]
            retry_config=retry,  # type: ignore[arg-type]
            **config,
        )

    def key(self, chunk_id: str) -> str:
        """The object name of a chunk."""
        name = f"{chunk_id[:2]}/{chunk_id}"
        return f"{self.prefix}/{name}" if self.prefix else name

    async def put(self, chunk: ChunkRef, data: memoryview) -> None:
        """Store a chunk's bytes (the same bytes again: a harmless repeat)."""
        import obstore

        try:
            await obstore.put_async(self._store, self.key(chunk.id), data)
        except obstore.exceptions.BaseError as exc:
            raise Unavailable(
                f"{self.url}: could not store chunk {chunk.id}: {_short(exc)}"
            ) from None

    async def get(self, chunk: ChunkRef) -> bytes:
        """A chunk's bytes, checked against its length, crc32c and id."""
        import obstore

        try:
            got = await obstore.get_async(self._store, self.key(chunk.id))
            data = bytes(await got.bytes_async())
        except (FileNotFoundError, obstore.exceptions.NotFoundError):
            raise NotFound(f"{self.url} has no object for chunk {chunk.id}") from None
        except obstore.exceptions.BaseError as exc:
            raise Unavailable(
                f"{self.url}: could not fetch chunk {chunk.id}: {_short(exc)}"
            ) from None
        view = memoryview(data)
        if (
            len(data) != chunk.length
            or crc32c(view) != chunk.crc32c
            or content_id(view) != chunk.id
        ):
            raise IntegrityError(f"{self.url}: the object of chunk {chunk.id} does not match it")
        return data


def _short(exc: BaseException) -> str:
    """obstore's message without its multi-line debug detail."""
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
