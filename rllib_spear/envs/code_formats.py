"""Code-tool formats: every value of the code tool that a recipe fixes, as one record.

``code_math`` runs model-written Python; *how* it does so (limits, prelude, what a result looks
like, how the prompt is built, which call syntax is parsed, how the answer is checked) is a
:class:`CodeToolFormat`, chosen by name with ``env_config.tool_format``. The built-ins:

``default``  this project's own format (``rllib_spear/envs/code_math.py``): 10 s wall / 5 s CPU,
             ``from math import *`` prelude, merged stdout+stderr cut to 1000 characters, a
             system prompt per parser, results wrapped in the parser's tag in a user turn,
             ``math_answers_match`` on the last ``\\boxed{}``.
``retool``   the released SPEAR ReTool recipe's SandboxFusion tool
             (``rllib_spear/envs/retool_format.py``; docs/tools.md has the contract table).

A new format is one :func:`register_tool_format` call with a :class:`CodeToolFormat`; nothing in
the environment changes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from rllib_spear.registry import Registry

__all__ = ["CodeToolFormat", "TOOL_FORMATS", "register_tool_format", "get_tool_format", "tool_format_names"]


@dataclass(frozen=True)
class CodeToolFormat:
    """The contract of one code tool.

    ``sandbox``: :class:`~rllib_spear.envs.sandbox.SandboxConfig` fields of the format (limits,
    preamble, stream handling); ``env_config.sandbox_config`` (a dict) overrides them field by
    field. ``max_obs_chars`` / ``max_calls_per_turn``: defaults of the env options of those names.
    ``system_prompts``: the built-in system prompt per parser name, or None for "no system
    message" (``env_config.system_prompt`` still adds one). ``user_text(task, prompt_field)``:
    the user message. ``parser``: a registered parser name, None for ``env_config.parser``
    (default ``code``), or a factory ``parser(max_calls)`` of the format's own call rule (then
    ``env_config.parser`` is refused). ``code_prefix``: source put before every cell (it runs in
    the same program, so line numbers count it). ``result_text(result, limit)``: one call's
    :class:`~rllib_spear.envs.sandbox.SandboxResult` as text. ``tag_results``: wrap every result in
    the parser's ``<tag>..</tag>`` (False: the observation is the bare text, for the
    ``chat_template`` observation template to render as a ``tool`` message).
    ``answer(turn_text, gold)``: ``(prediction or None, correct)``. ``score_truncated``: a turn
    cut by ``max_turns`` is still scored (else it is wrong). ``tool_schemas``: OpenAI function
    schemas given to the chat template (``tools=``) when the prompt is rendered.
    ``sandbox_imports``: modules the format's prelude needs inside the sandbox, checked when the
    environment is built.
    """

    name: str
    sandbox: Mapping[str, Any]
    max_obs_chars: int
    max_calls_per_turn: int
    system_prompts: Mapping[str, str] | None
    user_text: Callable[[Mapping[str, Any], str], str]
    result_text: Callable[[Any, int], str]
    answer: Callable[[str, str], "tuple[str | None, bool]"]
    parser: str | Callable[[int], Any] | None = None
    code_prefix: str = ""
    tag_results: bool = True
    score_truncated: bool = False
    tool_schemas: tuple[Mapping[str, Any], ...] | None = None
    sandbox_imports: tuple[str, ...] = ()
    prompt_fields: tuple[str, ...] = ("prompt",)  # accepted values of env_config.prompt_field


TOOL_FORMATS: Registry[CodeToolFormat] = Registry(
    "code tool format", register_hint="rllib_spear.envs.code_formats.register_tool_format")


def register_tool_format(fmt: CodeToolFormat, *, override: bool = False) -> CodeToolFormat:
    """Register ``fmt`` under ``fmt.name`` (a taken name raises unless ``override=True``)."""
    if not isinstance(fmt, CodeToolFormat):
        raise TypeError(f"register_tool_format expects a CodeToolFormat, got {type(fmt).__name__}")
    return TOOL_FORMATS.register(fmt.name, fmt, override=override)


def _load_builtins() -> None:
    # The built-ins live next to the code they describe; importing them registers them.
    from . import code_math, retool_format  # noqa: F401


def get_tool_format(name: str) -> CodeToolFormat:
    """The format registered as ``name``; ``ValueError`` naming the choices otherwise."""
    _load_builtins()
    return TOOL_FORMATS.get(name)


def tool_format_names() -> list[str]:
    """Names of the registered code-tool formats, sorted."""
    _load_builtins()
    return TOOL_FORMATS.names()
