"""What a PostgreSQL engine's URL says, without importing psycopg.

The command line tells the engines apart by scheme (``is_postgres``) before
anything needs psycopg; messages name a URL without its password
(``display_url``).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

SCHEMES = ("postgresql", "postgres")


def is_postgres(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL database."""
    return urlsplit(url).scheme in SCHEMES


def display_url(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{parts.username}@{host}" if parts.username else host
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "password"])
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
