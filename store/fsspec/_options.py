"""Which storage options ``graben://`` takes: ``Options`` fields and fsspec's own; any
other is a ``TypeError`` naming those (a misspelt credential must not leave a job on the
environment's), but another filesystem's bag of options is left to it."""

from __future__ import annotations

import difflib
from typing import Any

from fsspec.registry import known_implementations

from .._config import Options
from .._errors import InvalidArgument
from . import _urls

OPTIONS = frozenset(Options.__dataclass_fields__)
_FSSPEC_OPTIONS = frozenset(
    {"use_listings_cache", "listings_expiry_time", "max_paths", "asynchronous", "loop", "anon"}
)
"""fsspec's own options, which any filesystem takes (``skip_instance_cache`` never reaches
``__init__``), and ``anon``, which pandas adds when it opens a file again after a
``PermissionError`` (for public S3 buckets): graben has no anonymous access, so it changes
nothing and the retry meets the same refusal, not a complaint about ``anon``."""


def check_options(options: dict[str, Any]) -> None:
    """Refuse an option graben does not take (``TypeError``, as for any unexpected keyword
    argument), naming the ones it does: dropped, a misspelt ``tokne`` or an unknown
    credential would leave the job on the environment's credentials."""
    if "target_protocol" in options:
        raise InvalidArgument(
            "fsspec took a graben URL for a chain of filesystems: it splits URLs at '::', "
            "so an IPv6 address written with '::' cannot pass through it; name the cluster "
            "by a host name or the address written out (0:0:0:0:0:0:0:1), or pass the URL "
            "itself: GrabenFileSystem(url='graben://[::1]:7100')"
        )
    unknown = sorted(
        name
        for name in set(options) - OPTIONS - _FSSPEC_OPTIONS
        if not _for_another(name, options[name])
    )
    if not unknown:
        return
    near = {m for name in unknown for m in difflib.get_close_matches(name, OPTIONS, n=1)}
    raise TypeError(
        f"graben:// takes no option {', '.join(map(repr, unknown))}"
        + (f" (did you mean {', '.join(map(repr, sorted(near)))}?)" if near else "")
        + f"; it takes url, the fields of graben.store.Options ({', '.join(sorted(OPTIONS))})"
        f" and fsspec's {', '.join(sorted(_FSSPEC_OPTIONS))}"
    )


def _for_another(name: str, value: object) -> bool:
    """Whether an option is another filesystem's bag of options, keyed by its protocol
    (fsspec's convention for chained URLs; HF datasets adds ``hf`` to the dict a caller
    gave it): not ours to take or refuse."""
    return isinstance(value, dict) and name != _urls.PROTOCOL and name in known_implementations
