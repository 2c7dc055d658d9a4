"""The ``graben`` script's first frame: Ctrl-C is one line from here on.

The dispatcher (``_main``) and the store's modules load inside ``main``, so
an interrupt while they load exits 130 with a line, not a traceback. Up to
here only ``sys`` and ``importlib`` are imported (not even ``typing``): what
is left is the interpreter's own start, about 20 ms.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``graben`` script."""
    try:
        from ._main import main as dispatch

        return dispatch(argv)
    except KeyboardInterrupt:  # before the dispatcher could say more
        print("graben: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT, as shells report it
