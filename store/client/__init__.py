"""The client: the store's API, written once against the transport seam.

Owns ``AsyncClient`` (``_aclient``) and its sync facade ``Client``
(``_client``, on one event loop thread: ``_loop``), the file objects
(``_afiles``, ``_files``), the write path (``_upload``: staging, hashing,
placement, upload, commit), the read path (``_reader``: verified reads,
read-ahead), one client per store per process for every door
(``_shared``), paged listings and layouts (``_pages``) and the client's side
of fsck (``_fsck``), and ``AgentClient`` (``_agent``): a rank's calls to its
node's memory agent.

May import: ``embedded`` (to open a local store), ``transport``, ``wire``
and the store's shared modules; never ``meta`` or ``node`` directly, nor
``cli`` or ``fsspec``.
"""

from ._aclient import AsyncClient
from ._afiles import AsyncReadFile, AsyncWriteFile
from ._agent import AgentClient
from ._client import Client, connect
from ._files import ReadFile, WriteFile
from ._loop import adopt as adopt_loop
from ._shared import clear_shared_clients, shared_client
from ._unmade import made as store_made
from ._upload import Staging, Upload, WriteOptions

__all__ = [
    "AgentClient",
    "AsyncClient",
    "AsyncReadFile",
    "AsyncWriteFile",
    "Client",
    "ReadFile",
    "Staging",
    "Upload",
    "WriteFile",
    "WriteOptions",
    "adopt_loop",
    "clear_shared_clients",
    "connect",
    "shared_client",
    "store_made",
]
