"""The weight-sync transports by name: ``.learners(weight_sync_transport=name)`` picks one
(docs/design.md "Weight streaming").

:func:`register_transport` adds a :class:`~rllib_spear.weight_streaming.transport.Transport`
subclass under a name; the built-ins (``weight_streaming/transports/``) are registered when this
module is imported. ``"auto"`` is not a transport but the ordered list :data:`AUTO`: the first
one that can run for the placement carries each sync (the rule: ``sync.WeightSync``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..registry import Registry

if TYPE_CHECKING:
    from .transport import Transport

__all__ = ["TRANSPORTS", "AUTO_NAME", "AUTO", "register_transport", "get_transport", "transport_names",
           "transport_class"]

#: The registered transport classes.
TRANSPORTS: Registry[type["Transport"]] = Registry(
    "weight-sync transport", register_hint="rllib_spear.weight_streaming.register_transport")
#: The value of ``weight_sync_transport`` that chooses per sync among :data:`AUTO`.
AUTO_NAME = "auto"
#: What ``"auto"`` tries, in order: shared memory when every runner is on learner rank 0's node
#: and the weights are whole CPU tensors, else the collective when its group can be formed, else
#: the object store, which always runs.
AUTO = ("shared_memory", "collective", "object_store")


def register_transport(name: str, cls: type["Transport"] | None = None, *, override: bool = False) -> Any:
    """Register a ``Transport`` subclass under ``name`` (as a decorator when ``cls`` is omitted)
    and set its ``name``. The class reaches the learners and runners with the driver's calls
    (cloudpickle: by reference where they can import its module, else register that module with
    ``ray.cloudpickle.register_pickle_by_value``)."""
    from .transport import Transport

    if name == AUTO_NAME:
        raise ValueError(f"{AUTO_NAME!r} is the ordered list AUTO, not a transport; register under another name")

    def add(c: type[Transport]) -> type[Transport]:
        if not (isinstance(c, type) and issubclass(c, Transport)):
            raise TypeError(f"register_transport({name!r}): a transport is a subclass of "
                            f"rllib_spear.weight_streaming.Transport, got {c!r}")
        TRANSPORTS.register(name, c, override=override)
        c.name = name
        return c

    return add if cls is None else add(cls)


def get_transport(name: str) -> type["Transport"]:
    """The transport class registered under ``name`` (ValueError naming the choices otherwise)."""
    return TRANSPORTS.get(name)


def transport_names() -> list[str]:
    """Every value ``weight_sync_transport`` takes besides None: ``"auto"`` and the registered names."""
    return [AUTO_NAME, *TRANSPORTS.names()]


def transport_class(transport: str | type["Transport"]) -> type["Transport"]:
    """A transport given by its class or by its registered name."""
    return transport if isinstance(transport, type) else get_transport(transport)


from . import transports as _builtins  # noqa: E402,F401  (registers the built-ins; they import this module)
