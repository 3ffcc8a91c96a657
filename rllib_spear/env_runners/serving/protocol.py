"""What the endpoint honours of an OpenAI request, and what it refuses with a 400.

The policy is trained on what the engine sampled, so a request may not change the distribution
the learner scores (docs/design.md "The OpenAI endpoint"):

* ``temperature``: unset, or the temperature the policy is trained at
  (``.env_runners(temperature=...)``, the learner's scoring temperature); another value is a 400.
  An evaluation episode samples with the evaluation's parameters (``eval_temperature``, ...)
  whatever the program asks.
* ``top_p`` is honoured (the engine's log-probs are those before truncation, which the learner
  recomputes); ``max_tokens`` / ``max_completion_tokens`` cap the completion (with the per-turn
  ``max_new_tokens`` and the context left); ``stop`` adds stop strings (left out of the returned
  text, kept in the trained tokens); ``n`` must be 1.
* ``seed``, ``presence_penalty`` / ``frequency_penalty`` / ``logit_bias`` other than neutral,
  ``top_logprobs``, ``stream``, ``response_format`` other than text, ``tool_choice`` other than
  ``"auto"`` / ``"none"``, and any parameter not listed here: a 400 naming it.
* Ignored (they change nothing sampled): ``user``, ``metadata``, ``store``,
  ``parallel_tool_calls``, ``stream_options``, ``service_tier``, ``reasoning_effort``.
* ``return_token_ids`` (vLLM's extension): the response also carries ``prompt_token_ids`` and the
  choice's ``token_ids``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..engines.base import SamplingConfig
from .errors import EndpointError

__all__ = ["SamplingPolicy", "RequestSampling", "request_sampling", "check_tools", "IGNORED"]

IGNORED = frozenset({"user", "metadata", "store", "parallel_tool_calls", "stream_options", "service_tier",
                     "reasoning_effort"})
_COMMON = frozenset({"model", "temperature", "top_p", "max_tokens", "stop", "n", "stream", "seed", "presence_penalty",
                     "frequency_penalty", "logit_bias", "logprobs", "return_token_ids"})
CHAT_KEYS = _COMMON | {"messages", "max_completion_tokens", "tools", "tool_choice", "top_logprobs", "response_format"}
COMPLETION_KEYS = _COMMON | {"prompt", "echo", "suffix", "best_of"}


@dataclass(frozen=True)
class SamplingPolicy:
    """How one episode's requests are sampled: its ``sampling`` parameters; the temperature the
    policy is trained at (``trained_temperature``, None: ``sampling``'s), the only one a request
    may name; ``evaluation``: the episode samples with the evaluation's parameters, whatever a
    request asks (``top_p``, ``seed``); its context budget (``max_model_len``: a prompt leaving
    less than ``min_generation_tokens`` is a 400)."""

    sampling: SamplingConfig
    trained_temperature: float | None = None
    evaluation: bool = False
    max_model_len: int = 1024
    min_generation_tokens: int = 8

    @property
    def temperature(self) -> float:
        """The temperature a request may name."""
        return self.sampling.temperature if self.trained_temperature is None else self.trained_temperature


@dataclass(frozen=True)
class RequestSampling:
    """The request's sampling parameters, its own token cap (None: none asked) and options."""

    sampling: SamplingConfig
    max_tokens: int | None
    logprobs: bool
    return_token_ids: bool


def _number(body: dict[str, Any], key: str) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise EndpointError(f"{key} must be a number, got {v!r}", param=key)
    return float(v)


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise EndpointError(f"{key} must be an integer >= 1, got {v!r}", param=key)
    return v


def _refuse_unknown(body: dict[str, Any], known: frozenset[str]) -> None:
    for key in body:
        if key not in known and key not in IGNORED:
            raise EndpointError(f"parameter {key!r} is not served by this endpoint (it serves {sorted(known)}; "
                                f"ignored: {sorted(IGNORED)})", param=key)


def request_sampling(body: dict[str, Any], policy: SamplingPolicy, *, chat: bool) -> RequestSampling:
    """The sampling of one request under ``policy`` (see the module doc); EndpointError (400)
    naming the parameter for anything the endpoint cannot honour."""
    _refuse_unknown(body, CHAT_KEYS if chat else COMPLETION_KEYS)
    base = policy.sampling
    n = body.get("n")
    if n is not None and n != 1:
        raise EndpointError(f"n must be 1 (one completion per request; call again for more), got {n!r}", param="n")
    if body.get("stream"):
        raise EndpointError("stream=True is not served: call with stream=False", param="stream")
    if body.get("seed") is not None and not policy.evaluation:
        raise EndpointError("seed is set by the trainer for every request (each episode of a group must sample "
                            "differently): leave it unset", param="seed")
    for key in ("presence_penalty", "frequency_penalty"):
        if _number(body, key) not in (None, 0.0):
            raise EndpointError(f"{key} changes the distribution the policy is trained on: leave it unset or 0",
                                param=key)
    if body.get("logit_bias"):
        raise EndpointError("logit_bias changes the distribution the policy is trained on: leave it unset",
                            param="logit_bias")
    temperature, trained = _number(body, "temperature"), policy.temperature
    if temperature is not None and temperature != trained:
        raise EndpointError(f"temperature {temperature:g} differs from the temperature the policy is trained at "
                            f"({trained:g}, .env_runners(temperature=...)): leave it unset or pass {trained:g}",
                            param="temperature")
    top_p = _number(body, "top_p")
    if top_p is not None and not 0 < top_p <= 1:
        raise EndpointError(f"top_p must be in (0, 1], got {top_p:g}", param="top_p")
    max_tokens = _positive_int(body, "max_tokens")
    if chat:
        asked = _positive_int(body, "max_completion_tokens")
        max_tokens = asked if max_tokens is None else max_tokens if asked is None else min(asked, max_tokens)
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise EndpointError("stop must be a non-empty string or a list of them", param="stop")
    logprobs = body.get("logprobs")
    if chat:
        if body.get("top_logprobs"):
            raise EndpointError("top_logprobs is not served (the sampled tokens' log-probs are: logprobs=True)",
                                param="top_logprobs")
        fmt = body.get("response_format")
        if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
            raise EndpointError("response_format other than {'type': 'text'} is not served (no constrained decoding)",
                                param="response_format")
    else:
        if logprobs not in (None, 0, False, True) and logprobs != 1:
            raise EndpointError("logprobs > 1 asks for alternatives, which are not served (logprobs=0 or 1 gives the "
                                "sampled tokens' log-probs)", param="logprobs")
        if body.get("echo"):
            raise EndpointError("echo=True is not served", param="echo")
        if body.get("suffix"):
            raise EndpointError("suffix is not served", param="suffix")
        if body.get("best_of") not in (None, 1):
            raise EndpointError("best_of must be 1", param="best_of")
    sampling = base
    if not policy.evaluation:
        sampling = dataclasses.replace(base, top_p=base.top_p if top_p is None else top_p)
    if stop:
        sampling = dataclasses.replace(sampling, stop=[*sampling.stop, *[s for s in stop if s not in sampling.stop]])
    return RequestSampling(sampling, max_tokens, logprobs is not None and logprobs is not False,
                           bool(body.get("return_token_ids")))


def check_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The request's tools when the model may call them (None: no tools, or ``tool_choice``
    "none"); a 400 for a malformed list or a ``tool_choice`` that forces a call."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise EndpointError(f"tool_choice {choice!r} is not served (no constrained decoding): use 'auto' or 'none'",
                            param="tool_choice")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise EndpointError("tools must be a list", param="tools")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise EndpointError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'description': "
                                "..., 'parameters': {...}}}}", param="tools")
    return None if choice == "none" else tools
