"""``python -m graben.fuse ARGS`` is ``graben mount ARGS``: how a background mount starts."""

from ._cli import mount_main

raise SystemExit(mount_main())
