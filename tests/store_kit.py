"""Sizes and helpers the store's tests share."""

SMALL_CHUNK = 64 * 1024
"""Chunk size for tests that want many chunks from few bytes."""
