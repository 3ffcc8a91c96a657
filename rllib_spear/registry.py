"""A small name -> object registry, the building block of the recipe layer (no Ray import).

Each pluggable kind (parsers, estimators, rewards, losses, filters, envs, ...) keeps one
:class:`Registry` next to its built-ins and exposes a ``register_<kind>`` / ``get_<kind>`` /
``<kind>_names`` trio on top of it, so a user selects a component by name in a config and adds
their own without editing the library::

    PARSERS = Registry("parser", register_hint="rllib_spear.envs.parsers.register_parser")

    @PARSERS.register("search_r1")
    class SearchR1Parser: ...

    PARSERS.register("my_parser", MyParser)   # direct form
    PARSERS.get("search_r1")                   # -> SearchR1Parser
    PARSERS.get("nope")  # ValueError: unknown parser 'nope'; choose from ['my_parser', 'search_r1']
                         # (register one with rllib_spear.envs.parsers.register_parser('nope'))

API: ``register(name, obj=None, *, override=False)``, ``get(name)``, ``names()``,
``name in registry``, ``unregister(name)``, ``len()``, ``iter()`` (names, sorted), ``items()``
(``(name, obj)`` pairs, sorted by name), ``view()`` (a read-only live ``Mapping`` name -> obj, in
registration order, e.g. to keep a module-level dict of earlier versions working). Registering a taken name raises ``ValueError`` unless
``override=True`` (registering the very same object again is a no-op). Objects are stored as given (classes, factories or instances); building one
from its config is the owner's job (for example ``get_parser(name, **kwargs)``).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Named objects of one ``kind`` (a singular noun used in messages, e.g. ``"parser"``).

    ``register_hint`` names the public function users call to add one (shown in the error of an
    unknown name); it defaults to ``"register_<kind>"``.
    """

    def __init__(self, kind: str, *, register_hint: str | None = None):
        self.kind = kind
        self.register_hint = register_hint or f"register_{kind.replace(' ', '_')}"
        self._items: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None, *, override: bool = False) -> Any:
        """Register ``obj`` under ``name`` and return it; with ``obj`` omitted, return a
        decorator that registers the decorated object (and returns it unchanged).

        Raises ``ValueError`` if ``name`` is taken by another object (pass ``override=True`` to
        replace it; the same object again is a no-op) and
        ``TypeError`` if ``name`` is not a non-empty string.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def _add(o: T) -> T:
            if name in self._items and not override and self._items[name] is not o:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered ({self._describe(self._items[name])}); "
                    f"pass override=True to replace it"
                )
            self._items[name] = o
            return o

        if obj is None:
            return _add
        return _add(obj)

    def get(self, name: str) -> T:
        """The object registered under ``name``; ``ValueError`` naming the choices otherwise."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown {self.kind} {name!r}; choose from {self.names()} "
                f"(register one with {self.register_hint}({name!r}))"
            ) from None

    def unregister(self, name: str) -> T:
        """Remove ``name`` and return its object (``KeyError`` if absent); meant for tests."""
        return self._items.pop(name)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        """``(name, obj)`` pairs, sorted by name."""
        return sorted(self._items.items(), key=lambda kv: kv[0])

    def view(self) -> Mapping[str, T]:
        """A read-only mapping name -> object that follows later registrations."""
        return MappingProxyType(self._items)

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._items
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"

    @staticmethod
    def _describe(obj: Callable[..., Any] | Any) -> str:
        mod = getattr(obj, "__module__", None)
        qual = getattr(obj, "__qualname__", None)
        return f"{mod}.{qual}" if mod and qual else repr(obj)[:80]
