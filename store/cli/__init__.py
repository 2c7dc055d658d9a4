"""The ``graben`` command and the store's subcommands.

Owns the script's first frame (``_entry``: loads the rest inside it, so
Ctrl-C is one line from the start), the dispatcher (``_main``: finds every
package's subcommands through the ``graben.commands`` entry points, prints
errors as one line; ``_configfile``: servers' flags from a TOML file), the
store's commands (``_cmds``: ls stat du mkdir rm mv cp fsck; ``_transfer``: cat get
put; ``_trees``: walking a tree for cp, get -r and du --physical), the
cluster's (``_cluster``: meta serve, node serve, status; ``_local``: cluster
up's flags, its servers started by ``graben.store.local``) and what they print
(``_render``). ``python -m graben.store.cli`` runs it.

May import: every layer of the store (it is the top one); nothing below
imports it.
"""

from ._entry import main

__all__ = ["main"]
