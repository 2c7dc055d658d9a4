"""Every metadata request's handler, registered beside the code that carries it out.

A component marks the method that carries out a request kind with
``@handles(Kind)``. Its parameters are the request's fields, by name (checked
when the method is marked); a keyed mutation's ``key`` arrives bound to the
request it came with (``bind``: a key sent again with another request is
refused). ``Handlers`` gathers the marked methods of the components a service
is made of, and runs a request with its one handler.

The rest of what every part must know of a request kind (whether it only
reads, how a client may repeat it, the right a tenant needs) is its ``Rule``,
declared with the request (``transport/_requests.py``). Adding an operation
is: its request with its rule, its handler marked here, and the client's
method; ``tests/store/meta/test_operations.py`` fails on a request without a
handler.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from .._errors import InvalidArgument
from ..transport import Repeat, Request
from ._idempotency import bind

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")
_MARK = "_graben_handles"


def handles(kind: type[Request[Any]]) -> Callable[[F], F]:
    """Mark a component's method as what carries out requests of ``kind``."""

    def mark(method: F) -> F:
        fields = set(kind.__struct_fields__)
        params = list(inspect.signature(method).parameters.values())[1:]  # not self
        names = {p.name for p in params}
        unknown = {p.name for p in params if p.default is p.empty} - fields
        if unknown or not fields <= names:
            raise TypeError(
                f"{method.__qualname__} handles {kind.__name__}: its parameters "
                f"{sorted(names)} must be the request's fields {sorted(fields)}"
            )
        setattr(method, _MARK, kind)
        return method

    return mark


class Handlers:
    """The handler of each request kind, from the marked methods of ``components``."""

    def __init__(self, *components: object) -> None:
        self._by_kind: dict[type[Any], Callable[..., Any]] = {}
        for component in components:
            for name, member in inspect.getmembers(type(component), callable):
                kind = getattr(member, _MARK, None)
                if kind is None:
                    continue
                if kind in self._by_kind:
                    raise TypeError(f"{kind.__name__} has two handlers")
                self._by_kind[kind] = getattr(component, name)

    def kinds(self) -> frozenset[type[Any]]:
        """The request kinds handled."""
        return frozenset(self._by_kind)

    def run(self, request: Request[R]) -> R:
        """Carry out ``request`` with its handler."""
        handler = self._by_kind.get(type(request))
        if handler is None:
            raise InvalidArgument(f"unknown metadata request {type(request).__name__}")
        fields = msgspec.structs.asdict(request)
        if request.rule.repeat is Repeat.KEYED and "key" in fields:
            fields["key"] = bind(request.key, request)  # type: ignore[attr-defined]
        result: R = handler(**fields)
        return result
