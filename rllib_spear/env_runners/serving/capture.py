"""One episode's calls to the endpoint: what each one sampled, and where a new request continues.

An :class:`EpisodeCapture` is opened per episode (``OpenAIEndpoint.open_episode``); the
episode's programs reach it through its own base URL, ``/episodes/<id>/v1``. Each call reserves
an index when it arrives (the order of the episode's calls, and the seed of its request), and
records, once sampled, a :class:`~rllib_spear.core.call_layout.CapturedCall` (prompt ids,
completion ids, log-probs, weights version) with what continuation needs:

* a chat call keeps its messages and tools (as :func:`~rllib_spear.env_runners.serving.chat.canonical`
  strings) and the reply it returned. A later request whose messages start with those messages
  followed by that reply continues from the call's prompt + completion ids (the longest such
  earlier call wins): the episode stays one context, token for token (token-in/token-out).
* a completion call keeps its prompt text and completion text; a later prompt that starts with
  both continues from its ids (only when the returned text is exactly what the ids decode to).

Closing the capture ends the episode: a call still in flight then is dropped, a later one is a 404.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from ...core.call_layout import CapturedCall
from .protocol import SamplingPolicy

__all__ = ["ChatTurn", "CompletionTurn", "EpisodeCapture", "CallRecord"]


@dataclass(frozen=True)
class ChatTurn:
    """What a later chat request must repeat to continue a chat call (canonical strings)."""

    messages: tuple[str, ...]
    tools: str
    reply: str


@dataclass(frozen=True)
class CompletionTurn:
    """What a later completion prompt must start with to continue a completion call."""

    prompt_text: str
    completion_text: str


@dataclass
class CallRecord:
    """One sampled call: the tokens, why sampling stopped (``"stop"`` / ``"length"``), and what the
    episode's stats count (tool calls in the reply, ``<tool_call>`` blocks that could not be
    read); ``closed``: the completion ended with the end-of-turn token."""

    call: CapturedCall
    finish_reason: str
    closed: bool
    tool_calls: int = 0
    malformed_tool_calls: int = 0
    chat: ChatTurn | None = None
    completion: CompletionTurn | None = None


@dataclass
class EpisodeCapture:
    """The calls of one episode (see the module doc). ``seed`` / ``index``: the request seeds are
    ``request_seed(seed, index, call index)``; ``policy``: how its requests are sampled;
    ``engine_gauge``: a context manager held while one of its requests is in the engine (the
    rollout's busy-time gauge); ``context_refusals`` counts its requests refused for the context
    budget."""

    episode_id: str
    policy: SamplingPolicy
    seed: int | None = None
    index: int = 0
    engine_gauge: Any = None
    context_refusals: int = 0
    _records: dict[int, CallRecord] = field(default_factory=dict)
    _next: int = 0
    _in_flight: set[int] = field(default_factory=set)
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------ requests
    def reserve(self) -> int | None:
        """The index of a call arriving now; None once the episode ended."""
        with self._lock:
            if self._closed:
                return None
            i, self._next = self._next, self._next + 1
            self._in_flight.add(i)
            return i

    def release(self, index: int) -> None:
        """A reserved call that failed before it sampled: it records nothing."""
        with self._lock:
            self._in_flight.discard(index)

    def record(self, index: int, record: CallRecord) -> bool:
        """Keep a sampled call; False (dropped) when the episode ended while it ran."""
        with self._lock:
            self._in_flight.discard(index)
            if self._closed:
                return False
            self._records[index] = record
            return True

    def chat_continuation(self, messages: Sequence[str], tools: str) -> tuple[CallRecord, int] | None:
        """The earlier chat call a request continues and the position of its reply in the
        request's messages (the longest match), or None."""
        best = None
        with self._lock:
            records = list(self._records.values())
        for rec in records:
            turn = rec.chat
            if turn is None or turn.tools != tools:
                continue
            k = len(turn.messages)
            if len(messages) > k and tuple(messages[:k]) == turn.messages and messages[k] == turn.reply:
                if best is None or k > best[1]:
                    best = (rec, k)
        return best

    def completion_continuation(self, prompt: str) -> tuple[CallRecord, str] | None:
        """The earlier completion call a text prompt continues and the text after it, or None."""
        best = None
        with self._lock:
            records = list(self._records.values())
        for rec in records:
            turn = rec.completion
            if turn is None:
                continue
            head = turn.prompt_text + turn.completion_text
            if prompt.startswith(head) and (best is None or len(head) > len(best[1])):
                best = (rec, head)
        return None if best is None else (best[0], prompt[len(best[1]):])

    # ------------------------------------------------------------------ the episode's end
    def close(self) -> list[CallRecord]:
        """End the episode; its records in the order the calls arrived."""
        with self._lock:
            self._closed = True
            return [self._records[i] for i in sorted(self._records)]
