"""graben.fuse: not built yet (see the open issues)."""

__all__: list[str] = []
