"""A manager's state dict whose values may be objects: modules, optimizers, Statefuls.

DCP loads in place, into what the given state dict already holds: an
optimizer's ``state_dict()`` taken before its first step has an empty
``state``, so its saved state had no place to land and was skipped, and a
resumed run diverged. So a value of the state dict given to ``save`` and the
loads may be the object itself: an ``nn.Module`` goes through DCP's
``get_model_state_dict`` / ``set_model_state_dict``; an optimizer through
``get_optimizer_state_dict`` / ``set_optimizer_state_dict``, with the module
of the state dict owning its parameters (its state keyed by parameter name,
made for a fresh optimizer: it loads on any world size); any other
``Stateful`` through its ``state_dict`` / ``load_state_dict``. Other values
pass as they are.

``plain`` takes each object's state (at save time: the caller stages it
before the loop goes on); a ``Target`` is a state dict being loaded: its
plain form, what ``check`` refuses, and ``restored`` giving the loaded
state back to its objects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from torch import nn
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.optim import Optimizer

from graben.store import InvalidArgument

_Ways = tuple[Callable[[], Any], Callable[[Any], object]]
"""How an object's state is taken, and how it is given back."""


def plain(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """``state_dict`` with each module, optimizer and ``Stateful`` as its state, taken now."""
    modules = _modules(state_dict)
    return {key: _plain_value(key, value, modules) for key, value in state_dict.items()}


def _plain_value(key: str, value: Any, modules: list[nn.Module]) -> Any:
    ways = _ways(key, value, modules)
    return value if ways is None else ways[0]()


class Target:
    """A state dict being loaded in place: its plain form, made when first asked for (a
    fresh optimizer's state is made then, by a step of zero gradients, so only once a
    step is to be loaded), and the loaded state given back to its objects."""

    def __init__(self, state_dict: dict[str, Any]) -> None:
        self.state_dict = state_dict
        self._plain: dict[str, Any] | None = None

    @property
    def plain(self) -> dict[str, Any]:
        """What DCP (or the memory tier) loads into."""
        if self._plain is None:
            self._plain = plain(self.state_dict)
        return self._plain

    def check(self, saved: Iterable[str]) -> None:
        """``InvalidArgument`` if an optimizer's entry and the checkpoint (``saved``: its
        keys, flattened as DCP does) do not match: optimizer state saved that a plain
        state dict given has no place for (loading in place would skip it, silently), or
        an optimizer given whose state the checkpoint lacks."""
        have = set(saved)
        for key, value in self.state_dict.items():
            if isinstance(value, Optimizer):
                _check_optimizer(key, flat_keys({key: self.plain[key]}), have)
            elif _optimizer_state(value):
                _check_places(key, set(flat_keys({key: value})), have)

    def restored(self, step: int) -> int:
        """Give the loaded state to the state dict: plain values into it, each object's
        state to the object; ``step``."""
        loaded, modules = self.plain, _modules(self.state_dict)
        for key, value in list(self.state_dict.items()):
            ways = _ways(key, value, modules)
            if ways is None:
                self.state_dict[key] = loaded[key]
            else:
                ways[1](loaded[key])
        return step


def flat_keys(state_dict: Mapping[str, Any]) -> list[str]:
    """The keys DCP gives ``state_dict``'s items (``.metadata`` has a saved one's)."""
    return list(flatten_state_dict(dict(state_dict))[0])


def _ways(key: str, value: Any, modules: list[nn.Module]) -> _Ways | None:
    """How ``value``'s state is taken and given back; None for a plain value."""
    if isinstance(value, nn.Module):
        return partial(get_model_state_dict, value), partial(set_model_state_dict, value)
    if isinstance(value, Optimizer):
        owner = _owner(key, value, modules)
        return (
            partial(get_optimizer_state_dict, owner, value),
            partial(set_optimizer_state_dict, owner, value),
        )
    if isinstance(value, Stateful):
        return value.state_dict, value.load_state_dict
    return None


def _modules(state_dict: Mapping[str, Any]) -> list[nn.Module]:
    return [value for value in state_dict.values() if isinstance(value, nn.Module)]


def _owner(key: str, optimizer: Optimizer, modules: list[nn.Module]) -> nn.Module:
    """The module of the state dict holding every parameter ``optimizer`` updates."""
    updated = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in modules:
        if updated <= {id(p) for p in module.parameters()}:
            return module
    raise InvalidArgument(
        f"the optimizer at {key!r} updates parameters of no module in the state dict: "
        f"put its model beside it ({{'model': model, {key!r}: optimizer}})"
    )


def _optimizer_state(value: Any) -> bool:
    """Whether ``value`` is an optimizer's ``state_dict()``, given as a plain dict."""
    return isinstance(value, Mapping) and "state" in value and "param_groups" in value


def _check_places(key: str, places: set[str], saved: set[str]) -> None:
    lost = sorted(k for k in saved if k.startswith(f"{key}.state.") and k not in places)
    if lost:
        raise InvalidArgument(
            f"the checkpoint holds optimizer state ({lost[0]}, ...) that the state dict's "
            f"{key!r} has no place for (an optimizer's state_dict() taken before its first "
            f"step is empty): pass the optimizer itself, {{{key!r}: optimizer}}, beside its model"
        )


def _check_optimizer(key: str, wanted: list[str], saved: set[str]) -> None:
    missing = [k for k in wanted if k not in saved]
    if not missing:
        return
    why = f"the checkpoint has no {missing[0]} for the optimizer at {key!r} "
    why += f"({len(missing)} keys missing)"
    if not any(k.startswith(f"{key}.state.") for k in saved):
        why += (
            ": it holds no optimizer state (saved from a state_dict() taken before the "
            f"first step); resume without {key!r}, then save with it"
        )
    raise InvalidArgument(why)
