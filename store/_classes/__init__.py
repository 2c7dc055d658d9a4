"""Storage classes, shared by every layer: their names, and the code ``ec:K+M`` names.

``parse`` / ``check_class`` / ``StorageClass`` read a class's text (``ec:6+3@1h``,
``replicated``, ``s3``) and write it back in one canonical form (``_names``):
the Python API and the command line check what they are given with them, the
metadata service keeps and converts by them. ``erasure`` cuts a chunk into K
data and M parity pieces and gives it back from any K (``_erasure``, zfec):
the leader encodes and repairs stripes with it, the client decodes them.

Pure: no I/O. May import: the store's errors; no layer.
"""

from . import _erasure as erasure
from ._names import MAX_PIECES, StorageClass, check_class, parse

__all__ = ["MAX_PIECES", "StorageClass", "check_class", "erasure", "parse"]
