"""graben.fuse: the store as a POSIX filesystem (``graben mount``).

``mount(url, mountpoint)`` mounts a store (embedded directory or cluster) with
close-to-open semantics: a file opened for writing is staged locally and
committed as one new version when its writer closes it, on fsync, or at its
last close (a writer killed mid-write leaves the old version); renames are atomic.
``unmount(mountpoint)`` takes it down again.
"""

from typing import TYPE_CHECKING

from graben.store import optional_door as _optional_door

if TYPE_CHECKING:
    from ._mount import MountError, clean_stale, mount, serve, unmount
    from ._options import MountOptions

__all__ = ["MountError", "MountOptions", "clean_stale", "mount", "serve", "unmount"]

# Without its extra, importing the door fails naming it; with it, each name's
# module is imported when the name is first used (``graben --help`` stays quick).
__getattr__ = _optional_door(
    __name__,
    "fuse",
    needs=("pyfuse3",),
    names={
        "._mount": ("MountError", "clean_stale", "mount", "serve", "unmount"),
        "._options": ("MountOptions",),
    },
)
