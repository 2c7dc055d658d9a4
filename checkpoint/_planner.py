"""Planners that keep DCP's planning cost flat as the world grows.

Stock DCP gathers every rank's full plan on the coordinator each save, and
every loading rank reads the whole world's metadata. These planners are
DCP's defaults with two changes:

- ``GrabenSavePlanner`` caches plans. A rank whose plan did not change since
  its last save sends an empty placeholder; the coordinator reuses its
  global plan and metadata (and ``GrabenWriter`` the pickled metadata). Keep
  one planner per state dict across steps: the cache lives in it.
- ``GrabenLoadPlanner`` tells ``GrabenReader``'s metadata which chunks this
  rank needs before planning, so only the rank files holding them are read,
  and keeps its read plan to itself instead of sending it to the coordinator.

Both work with any storage; the savings need ``GrabenWriter``/``GrabenReader``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan

from graben.store import InvalidArgument

from ._ranked import Wants, ranked_of


class GrabenSavePlanner(DefaultSavePlanner):
    """``DefaultSavePlanner`` that reuses its plans while the state dict's layout holds.

    Pass the same instance to every ``dcp.save``/``dcp.async_save`` of one
    state dict. The first save plans as DCP does; later ones with the same
    keys, shapes and sharding skip gathering plans and building metadata.
    """

    def __init__(
        self,
        *,
        flatten_state_dict: bool = True,
        flatten_sharded_tensors: bool = True,
        dedup_save_to_lowest_rank: bool = False,
    ) -> None:
        super().__init__(
            flatten_state_dict=flatten_state_dict,
            flatten_sharded_tensors=flatten_sharded_tensors,
            dedup_save_to_lowest_rank=dedup_save_to_lowest_rank,
        )
        self._local: SavePlan | None = None
        """This rank's plan as the coordinator last accepted it."""
        self._pending: SavePlan | None = None
        self._final: SavePlan | None = None
        """This rank's last finished plan."""
        self._all: list[SavePlan] | None = None
        """Coordinator: every rank's local plan at the last save."""
        self._global: tuple[list[SavePlan], Metadata] | None = None
        """Coordinator: the global plan and metadata made from ``_all``."""
        self._pending_global: tuple[list[SavePlan], tuple[list[SavePlan], Metadata]] | None = None
        """Coordinator: ``_all`` and ``_global`` of a save not yet past ``finish_plan``."""
        self.reused = False
        """Whether the last save reused this rank's cached plan instead of sending one."""

    # docstring inherited
    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        if self._local is not None and plan == self._local:
            self._pending = None
            return SavePlan([], usable=False)
        self._pending = plan
        return plan

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        self._pending_global = None  # a failed save's plan is not kept
        unchanged = [not plan.usable for plan in all_plans]
        if any(unchanged) and (self._all is None or len(self._all) != len(all_plans)):
            self._all = self._global = None
            raise InvalidArgument(
                "GrabenSavePlanner: a rank reused a plan the coordinator no longer has "
                "(was the coordinator's planner replaced?); save again"
            )
        if all(unchanged) and self._global is not None:
            self.global_plan, self.metadata = self._global
            return [SavePlan([], usable=False)] * len(all_plans), self.metadata
        same_world = self._all is not None and len(self._all) == len(all_plans)
        cache = self._all if self._all is not None and same_world else all_plans
        merged = [
            cached if not plan.usable else plan
            for plan, cached in zip(all_plans, cache, strict=True)
        ]
        global_plan, metadata = self._create_global_plan(merged)
        old = self._global[0] if self._global is not None and same_world else [None] * len(merged)
        # a rank gets a placeholder when the plan it has (the one it sent, or
        # its last one) is already right: most of the scatter, on the first save too
        delta = [
            SavePlan([], usable=False) if new == (sent if sent.usable else before) else new
            for sent, new, before in zip(all_plans, global_plan, old, strict=True)
        ]
        # kept once this rank finishes its plan too: a save that fails before
        # then must leave the cache as the ranks, which never took theirs, have it
        self._pending_global = (merged, (global_plan, metadata))
        self.global_plan, self.metadata = global_plan, metadata
        return delta, metadata

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        self.reused = self._pending is None
        if not new_plan.usable:  # a placeholder: the plan this rank sent, or its last one
            kept = self._final if self._pending is None else self._pending
            if kept is None:
                raise InvalidArgument("GrabenSavePlanner: told to reuse a plan it never made")
            # the storage layer's part (where to write this time) is new each save
            new_plan = dataclasses.replace(kept, storage_data=new_plan.storage_data)
        self._final = new_plan
        if self._pending is not None:
            self._local, self._pending = self._pending, None
        if self._pending_global is not None:
            (self._all, self._global), self._pending_global = self._pending_global, None
        self.plan = new_plan
        return new_plan


class GrabenLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that reads only the metadata this rank needs.

    With ``GrabenReader`` each rank reads the checkpoint's small directory
    and the metadata of the rank files whose chunks overlap its own, not the
    whole world's. Its read plan stays on the rank: the coordinator gets an
    empty one.
    """

    def __init__(
        self,
        *,
        flatten_state_dict: bool = True,
        flatten_sharded_tensors: bool = True,
        allow_partial_load: bool = False,
    ) -> None:
        super().__init__(
            flatten_state_dict=flatten_state_dict,
            flatten_sharded_tensors=flatten_sharded_tensors,
            allow_partial_load=allow_partial_load,
        )
        self._plan: LoadPlan | None = None

    # docstring inherited
    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None, "set_up_planner comes first"
        ranked = ranked_of(self.metadata)
        if ranked is not None:
            ranked.want(_wants(self.state_dict))
        self._plan = super().create_local_plan()
        return LoadPlan([], planner_data=None)

    def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
        assert self._plan is not None, "create_local_plan comes first"
        return self._plan


def _wants(state_dict: dict[str, Any]) -> Wants:
    return {fqn: _chunks(value) for fqn, value in state_dict.items()}


def _chunks(value: Any) -> list[ChunkStorageMetadata] | None:
    """The chunks of ``value`` this rank holds, as DCP plans them; None for bytes.

    A DTensor (any checkpointable tensor) names its own; a ShardedTensor's are its
    local shards; any other tensor is one chunk from its origin.
    """
    if hasattr(value, "__create_chunk_list__"):
        chunks: list[ChunkStorageMetadata] = value.__create_chunk_list__()
        return chunks
    if not isinstance(value, torch.Tensor):
        return None
    if hasattr(value, "local_shards"):  # a ShardedTensor, known without its private module
        return [
            _chunk(shard.metadata.shard_offsets, shard.metadata.shard_sizes)
            for shard in value.local_shards()
        ]
    return [_chunk([0] * value.dim(), value.size())]


def _chunk(offsets: Sequence[int], sizes: Sequence[int]) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
