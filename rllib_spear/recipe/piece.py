"""A registered piece of an algorithm: a function plus the ``training()`` knobs it reads.

Every estimator, reward shaper and response filter of the recipe layer is a :class:`Piece`.
``defaults`` are its knobs (name -> default): the algorithm configs collect them from the
registries, so any algorithm can switch any piece on and set its knobs with ``training()``.
``validate(cfg, err)`` checks those knobs and calls ``err(message)`` (which raises) on a bad one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..registry import Registry

__all__ = ["Piece", "piece_decorator", "collect_defaults", "ErrorFn"]

ErrorFn = Callable[[str], None]


@dataclass(frozen=True)
class Piece:
    """``fn`` does the work; ``defaults`` are the knobs it reads from the config; ``validate``
    checks them; ``metrics_namespace`` is where its metrics go (e.g. ``"spear"``)."""

    name: str
    fn: Callable[..., Any]
    defaults: dict[str, Any] = field(default_factory=dict)
    validate: Callable[[Any, ErrorFn], None] | None = None
    metrics_namespace: str | None = None
    doc: str = ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def check(self, cfg: Any, err: ErrorFn) -> None:
        if self.validate is not None:
            self.validate(cfg, err)


def piece_decorator(registry: Registry, name: str, *, defaults: dict[str, Any] | None = None,
                    validate: Callable[[Any, ErrorFn], None] | None = None,
                    metrics_namespace: str | None = None, override: bool = False) -> Callable:
    """The body of every ``register_*`` decorator: wrap ``fn`` in a :class:`Piece` and register it."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        piece = Piece(name, fn, dict(defaults or {}), validate, metrics_namespace, (fn.__doc__ or "").strip())
        registry.register(name, piece, override=override)
        return fn

    return wrap


def collect_defaults(*registries: Registry) -> dict[str, Any]:
    """Every knob of every registered piece (name -> default); two pieces that declare the same
    knob must agree on its default."""
    out: dict[str, Any] = {}
    for reg in registries:
        for _, piece in reg.items():
            for k, v in piece.defaults.items():
                if k in out and out[k] != v:
                    raise ValueError(f"knob {k!r}: {reg.kind} {piece.name!r} declares default {v!r}, "
                                     f"another piece {out[k]!r}")
                out[k] = v
    return out


# ---- knob checks shared by the pieces' validate functions (messages name the training() kwarg)
def check_numbers(cfg: Any, err: ErrorFn, names: tuple[str, ...], minimum: float = 0.0) -> None:
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < minimum:
            err(f"`{name}` must be a number >= {minimum:g}, got {v!r}")


def check_ints(cfg: Any, err: ErrorFn, names: tuple[str, ...], minimum: int = 0) -> None:
    for name in names:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            err(f"`{name}` must be an integer >= {minimum}, got {v!r}")


def check_choice(cfg: Any, err: ErrorFn, name: str, choices: tuple[Any, ...]) -> None:
    v = getattr(cfg, name)
    if v not in choices:
        err(f"`{name}` must be one of {list(choices)}, got {v!r}")
