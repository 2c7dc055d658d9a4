"""graben.bench: throughput of every door, beside its peers, in one run."""

__all__: list[str] = []
