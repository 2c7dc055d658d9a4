"""graben.store.local: a cluster on this machine, each server a child process.

What ``graben cluster up`` runs, and what the tests and the bench start their
clusters with. Every server is ``python -m graben.store.cli meta serve ...`` or
``... node serve ...``, started by its argv, so this package imports no command-line
code.

``LocalCluster`` (``_cluster``): metadata services and data nodes on loopback, ready
once every node has reported, whose processes a caller may kill and start again;
``cluster_up``: ``graben cluster up`` itself in a child process for a ``with`` block;
``is_new_store``: whether the cluster in a root needs ``--init``. One server at a time
(``_processes``): ``spawn`` starts one and returns it with its address, ``stop`` and
``kill`` end them, ``wait_for_nodes`` waits for data nodes to report,
``make_secret_file`` makes a cluster secret.

May import: the client and the wire, and the store's shared modules; only the
command line imports it (and the tests and the bench, from outside the store).
"""

from ._cluster import LocalCluster, cluster_up, is_new_store
from ._processes import (
    READY_TIMEOUT_S,
    STOP_TIMEOUT_S,
    kill,
    make_secret_file,
    spawn,
    stop,
    wait_for_nodes,
)

__all__ = [
    "READY_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "LocalCluster",
    "cluster_up",
    "is_new_store",
    "kill",
    "make_secret_file",
    "spawn",
    "stop",
    "wait_for_nodes",
]
