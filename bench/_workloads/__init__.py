"""The bench's workloads, one module per door: ``store``, ``cluster``, ``fsspec``,
``checkpoint``, ``fuse``, ``dataset``.

Each module registers its workloads with ``@workload(name, summary)``
(``graben.bench._registry``), in the order it defines them; the registry
imports the modules in the order of ``_registry.WORKLOAD_MODULES``. A
private package: its modules are behind ``graben.bench``'s door.
"""

__all__: list[str] = []
