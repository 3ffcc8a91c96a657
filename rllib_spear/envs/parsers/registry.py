"""The parser registry: parsers are selected by name (``env_config={"parser": name}``).

A parser is any object with ``parse(text) -> ParsedTurn`` (it must never raise on model output)
and a ``tag`` attribute (the tag that wraps tool output, e.g. ``"tool_response"``). Optionally
``call_names`` (the :class:`~rllib_spear.envs.parsers.base.ToolCall` names it produces, e.g.
``("search",)``), which lets an environment refuse a parser whose calls it cannot run, and
``max_calls`` (the most calls of a turn that are executed).

A user parser is registered and then selected in the env config, without editing the library::

    from rllib_spear.envs.parsers import ParsedTurn, ToolCall, register_parser

    @register_parser("my_parser")
    class MyParser:
        tag = "tool_response"
        call_names = ("search",)

        def __init__(self, max_queries: int = 8):   # env options it names are passed in
            self.max_queries = max_queries

        def parse(self, text: str) -> ParsedTurn: ...

    make_env("search_qa", parser="my_parser", system_prompt="...")

(an env has built-in system prompts only for the built-in parsers, so a new parser comes with
``system_prompt`` in the env config).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Collection, Mapping

from rllib_spear.registry import Registry

__all__ = ["PARSER_REGISTRY", "PARSERS", "register_parser", "get_parser", "parser_names", "make_parser"]

PARSER_REGISTRY: Registry[Callable[..., Any]] = Registry(
    "parser", register_hint="rllib_spear.envs.parsers.register_parser"
)
# name -> parser class, a read-only live view of the registry (the public dict of earlier
# versions; add parsers with register_parser).
PARSERS: Mapping[str, Callable[..., Any]] = PARSER_REGISTRY.view()


def register_parser(name: str, parser_cls: Callable[..., Any] | None = None, *, override: bool = False):
    """Register a parser class (or factory) under ``name``; without ``parser_cls`` a class
    decorator. A taken name raises ``ValueError`` unless ``override=True``."""
    return PARSER_REGISTRY.register(name, parser_cls, override=override)


def parser_names() -> list[str]:
    """Names of the registered parsers, sorted."""
    return PARSER_REGISTRY.names()


def _accepted(factory: Callable[..., Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``options`` that ``factory``'s signature names (all of them if it takes ``**kwargs``)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no introspectable signature: offer nothing
        return {}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(options)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in options.items() if k in names}


def get_parser(name: str, /, *, env_options: Mapping[str, Any] | None = None,
               supported_calls: Collection[str] | None = None, **kwargs: Any):
    """A new parser instance of the parser registered as ``name``.

    ``kwargs`` go to its constructor as given. ``env_options`` are the settings an environment
    offers every parser (``tools``, ``max_calls``, ``max_queries``): each is passed only if the
    constructor names it, so one call serves parsers with different settings. With
    ``supported_calls`` (the tool-call names the caller can run) a parser whose ``call_names``
    fall outside them is refused.

    Raises ``ValueError`` for an unknown name (naming the registered choices) or an unsupported
    parser.
    """
    factory = PARSER_REGISTRY.get(name)
    opts = _accepted(factory, env_options or {})
    opts.update(kwargs)
    parser = factory(**opts)
    calls = getattr(parser, "call_names", None)
    if supported_calls is not None and calls is not None and not set(calls) <= set(supported_calls):
        raise ValueError(
            f"parser {name!r} makes {sorted(set(calls))} calls; this environment runs only "
            f"{sorted(set(supported_calls))}"
        )
    return parser


def make_parser(name: str, **kwargs):
    """``get_parser(name, **kwargs)`` (the earlier name)."""
    return get_parser(name, **kwargs)
