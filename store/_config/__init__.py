"""Configuration, split by who reads it; the environment read in ``_env`` alone.

- ``_env``: the one reader of the environment (``env``, ``env_int``), every
  variable's name, and their precedence against arguments and defaults;
- ``_options``: ``Options``, how a client reads and writes;
- ``_tls``: ``TLS``, one process's TLS files, and a client's from the environment;
- ``_urls``: where a store is (``resolve``, ``split_url``, endpoints, the default home);
- ``_limits``: the sizes clients and servers agree on (chunks, pages, a disk's reserve);
- ``_places``: what is on this machine (caches, the encryption key file, the memory agent);
- ``_aws``: AWS settings, for the dataset door's S3 fetches and the servers' S3 tier;
- ``_sizes``: sizes as people write them (``parse_size``), and as they read them
  (``human_size``, ``ago``).

A shared module of the store: imports its errors, no layer.
"""

from ._aws import aws_environment, aws_settings
from ._env import (
    ENV_METRICS,
    ENV_SECRET,
    ENV_SECRET_FILE,
    ENV_TOKEN,
    ENV_TOKEN_FILE,
    child_environment,
    env,
)
from ._limits import (
    DEFAULT_CHUNK_SIZE,
    MAX_CHUNK_SIZE,
    RESERVE,
    page_entries,
    too_many_orphans,
)
from ._options import DEFAULT_REPLICA_DEADLINE, Options
from ._places import AGENT_PORT, agent_address, cache_home, encryption_key_file
from ._sizes import ago, human_size, parse_size
from ._tls import TLS, tls_from_env
from ._urls import Target, cluster_url, endpoints, resolve, split_url

__all__ = [
    "AGENT_PORT",
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_REPLICA_DEADLINE",
    "ENV_METRICS",
    "ENV_SECRET",
    "ENV_SECRET_FILE",
    "ENV_TOKEN",
    "ENV_TOKEN_FILE",
    "MAX_CHUNK_SIZE",
    "RESERVE",
    "TLS",
    "Options",
    "Target",
    "agent_address",
    "ago",
    "aws_environment",
    "aws_settings",
    "cache_home",
    "child_environment",
    "cluster_url",
    "encryption_key_file",
    "endpoints",
    "env",
    "human_size",
    "page_entries",
    "parse_size",
    "resolve",
    "split_url",
    "tls_from_env",
    "too_many_orphans",
]
