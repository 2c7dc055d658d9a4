"""The environment: every variable graben takes from it is read here, through ``env``.

Precedence, highest first: arguments to ``connect``/``Options`` (``token`` or
``token_file``), then the environment (``GRABEN_URL``, ``GRABEN_HOME``,
``GRABEN_CHUNK_SIZE``, for a cluster ``GRABEN_TLS_CA`` / ``GRABEN_TLS_CERT`` /
``GRABEN_TLS_KEY`` (``tls_from_env``) and ``GRABEN_TOKEN``, then
``GRABEN_SECRET`` / ``GRABEN_SECRET_FILE``, read by ``wire/_auth.py``:
``cluster_token``, ``load_secret``), then the defaults. Servers read
``GRABEN_PAGE_ENTRIES`` (``page_entries``) on every page they serve; the
embedded store and data nodes ``GRABEN_ENCRYPTION_KEY_FILE``
(``encryption_key_file``); a rank ``GRABEN_AGENT`` (``agent_address``);
the servers' S3 tier and the dataset door ``AWS_*`` (``aws_environment``,
``aws_settings``); caches ``XDG_CACHE_HOME`` (``cache_home``). Child
processes get the environment whole, with what graben adds
(``child_environment``).

The other modules of ``_config`` ask here, and so do the layers (the
command line's colours, the cluster's credentials): this module is the one
that touches ``os.environ``.
"""

from __future__ import annotations

import os

from .._errors import InvalidArgument

ENV_URL = "GRABEN_URL"
"""The store ``connect()`` opens when given none."""
ENV_HOME = "GRABEN_HOME"
"""The default embedded store's directory."""
ENV_CHUNK_SIZE = "GRABEN_CHUNK_SIZE"
"""Bytes per chunk of new files, unless ``Options`` says."""
ENV_PAGE_ENTRIES = "GRABEN_PAGE_ENTRIES"
"""Most entries in one page a server sends (tests lower it)."""
ENV_SECRET = "GRABEN_SECRET"
"""The cluster secret itself, as text."""
ENV_SECRET_FILE = "GRABEN_SECRET_FILE"
"""A file holding the cluster secret."""
ENV_TOKEN = "GRABEN_TOKEN"
"""A cluster client's token: a tenant's (``graben token create``), or the cluster's own."""
ENV_TOKEN_FILE = "GRABEN_TOKEN_FILE"
"""A file (0600) holding a cluster client's token; ``$GRABEN_TOKEN`` comes first."""
ENV_AGENT = "GRABEN_AGENT"
"""``HOST:PORT`` of this node's memory agent (``graben agent serve``)."""
ENV_METRICS = "GRABEN_METRICS"
"""Where servers serve their metrics when ``--metrics`` is not given: ``off``, or
``HOST:0`` (any free port); unset: each beside its own port."""
ENV_TLS_CA = "GRABEN_TLS_CA"
ENV_TLS_CERT = "GRABEN_TLS_CERT"
ENV_TLS_KEY = "GRABEN_TLS_KEY"
ENV_ENCRYPTION_KEY_FILE = "GRABEN_ENCRYPTION_KEY_FILE"
"""The store's key for chunk files encrypted at rest."""


def env(name: str) -> str | None:
    """A variable of the environment, ``None`` if unset or empty: every module asks here,
    so what graben reads from the environment is in this one module (see its docstring
    for each variable's precedence)."""
    return os.environ.get(name) or None


def child_environment(**extra: str) -> dict[str, str]:
    """The environment for a child process: this one's, with ``extra`` over it (the
    metadata backup hands PostgreSQL's tools the engine's password as ``PGPASSWORD``,
    never on their command line)."""
    return {**os.environ, **extra}


def env_int(name: str, default: int) -> int:
    """An integer variable: ``default`` if unset; set but empty or not a number,
    ``InvalidArgument`` naming it."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"${name} must be an integer, not {value!r}") from None
