"""The fsspec door: ``graben://`` URLs for fsspec and everything built on it.

Owns ``GrabenFileSystem`` (``_filesystem``), registered with fsspec by the
``fsspec.specs`` entry point (which names ``graben.store:GrabenFileSystem``),
and the routing of URLs to the store they name (``_urls``).

May import: the ``client`` and the store's shared modules; nothing below
imports it.
"""

from ._filesystem import GrabenFileSystem

__all__ = ["GrabenFileSystem"]
