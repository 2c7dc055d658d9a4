"""Doors whose dependencies are an optional extra: checked on import, loaded on first use.

``graben.fuse`` needs pyfuse3 and trio, ``graben.checkpoint`` torch, and so
on; ``pip install graben`` brings none of them. A door's ``__init__`` calls
``optional_door``: importing the door without its extra raises ``MissingExtra``
naming the extra, and with it installed still imports nothing heavy until
one of the door's names is used, so that ``graben --help`` (which loads every
door's parser) starts in a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.util import find_spec
from typing import Any

from ._errors import MissingExtra


def optional_door(
    package: str, extra: str, needs: tuple[str, ...], names: Mapping[str, tuple[str, ...]]
) -> Callable[[str], Any]:
    """Raise ``MissingExtra`` unless every module in ``needs`` is installed (none is
    imported); return the door's module ``__getattr__`` that imports each public name
    from its module (``names``: module, relative to ``package`` -> its public names)
    when it is first used."""
    for module in needs:
        if find_spec(module) is None:
            missing = ModuleNotFoundError(f"No module named {module!r}", name=module)
            message = f"{package} needs the {extra!r} extra: pip install 'graben[{extra}]'"
            raise MissingExtra(message) from missing
    home = {name: module for module, public in names.items() for name in public}

    def __getattr__(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(home[name], package), name)

    return __getattr__
