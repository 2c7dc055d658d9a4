"""The memory agent: a node's memory tier for checkpoints (``graben agent serve``).

One agent per training node holds segments (a rank's staged state for one
step of one job) as files in shared memory (``/dev/shm``): they outlive the
training processes that wrote them. The agent owns the bookkeeping (``_shelf``,
pure: what is held, what may be dropped, within a memory limit), hands ranks
files to write into and read from, copies each finished segment to a peer
agent on another host, and pulls a segment back from a peer for a
replacement host (``_server``). What a segment holds is the writer's affair:
the agent never reads it.

May import: ``transport`` (its calls' bodies: ``_agent_calls``), ``wire`` and
the store's shared modules. Ranks reach it with ``graben.store.AgentClient``.
"""

from ._server import Agent

__all__ = ["Agent"]
