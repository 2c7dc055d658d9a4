"""``python -m graben.store.cli``: the ``graben`` command (how tests and the cluster spawn it)."""

import sys

from . import main

sys.exit(main())
