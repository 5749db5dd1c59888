"""Named policies: pure functions registered by name, one registry per kind.

Placement (:mod:`stager.layout`), rebuild replacement (:mod:`stager.meta.upkeep.replan`),
shuffle order, rank partition and worker split (:mod:`stager.loader`) each keep
a :class:`Registry`; :data:`REGISTRIES` lists every kind, so a policy can be
looked up, read, tested and swapped alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable[..., object])


class Registry(Generic[F]):
    """Policies of one kind, by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._policies: dict[str, F] = {}
        REGISTRIES[kind] = self

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: ``@REGISTRY.register("name")`` on a pure function."""
        def add(fn: F) -> F:
            if name in self._policies:
                raise ValueError(f"{self.kind} policy {name!r} registered twice")
            self._policies[name] = fn
            return fn
        return add

    def __getitem__(self, name: str) -> F:
        try:
            return self._policies[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} policy {name!r}; "
                             f"known: {sorted(self._policies)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._policies

    def __iter__(self) -> Iterator[str]:
        return iter(self._policies)

    def __len__(self) -> int:
        return len(self._policies)


REGISTRIES: dict[str, Registry] = {}  # type: ignore[type-arg]
