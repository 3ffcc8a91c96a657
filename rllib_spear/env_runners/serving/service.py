"""The endpoint's two operations without HTTP: a chat completion and a completion, each one
request to the engine's async API (``GenerationEngine.agenerate``: the HF engine's
continuous-batching scheduler, vLLM's ``AsyncLLM``), awaited on the runner's agent loop, so the
requests of concurrent episodes batch in the engine as the async agent loop's turns do.

Per request: the prompt ids (continued from an earlier call of the episode where the request
repeats it, serving/capture.py; else templated whole, serving/chat.py), the context budget (a
prompt leaving less than ``min_generation_tokens`` of ``max_model_len`` is a 400,
``context_length_exceeded``), the sampling of serving/protocol.py, the request's seed
(``request_seed(episode seed, episode index, call index)``, as the async loop seeds its turns),
then the reply in OpenAI's format and, in an episode, the record of the call.
"""
from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any, Sequence

from ...core.call_layout import CapturedCall
from ..async_rollout import request_seed
from ..engines.base import GenerationOutput
from .capture import CallRecord, ChatTurn, CompletionTurn, EpisodeCapture
from .chat import ChatRenderer, ParsedCompletion, canonical, normalize_messages, parse_tool_calls
from .errors import EndpointError
from .protocol import RequestSampling, SamplingPolicy, check_tools, request_sampling

__all__ = ["CompletionService"]


class CompletionService:
    """Serves chat and text completions of one engine under one model name.

    Args:
        engine: the runner's engine (its ``agenerate`` is awaited on the agent loop).
        renderer: the tokenizer's chat template (serving/chat.py).
        model_name: the name requests must give as ``model``.
        policy: the sampling of calls outside an episode (``/v1``; never recorded).
    """

    def __init__(self, engine: Any, renderer: ChatRenderer, model_name: str, policy: SamplingPolicy) -> None:
        self.engine, self.renderer, self.model_name, self.policy = engine, renderer, model_name, policy
        self.refused = 0  # requests answered with an error body (app.py counts them; tests read it)

    # ------------------------------------------------------------------ operations
    async def chat(self, body: dict[str, Any], episode: EpisodeCapture | None) -> dict[str, Any]:
        self._check_model(body)
        policy = episode.policy if episode is not None else self.policy
        req = request_sampling(body, policy, chat=True)
        tools = check_tools(body)
        self.renderer.check_tools(tools)
        messages = normalize_messages(body.get("messages"))
        keys, tools_key = tuple(canonical(m) for m in messages), canonical(tools)
        prompt = None
        if episode is not None:
            found = episode.chat_continuation(keys, tools_key)
            if found is not None:
                rec, k = found
                rest = self.renderer.continuation_ids(messages, k, tools, rec.closed)
                if rest is not None:
                    prompt = [*rec.call.prompt_ids, *rec.call.completion_ids, *rest]
        if prompt is None:
            prompt = self.renderer.prompt_ids(messages, tools)
        out, index = await self._sample(prompt, req, policy, episode)
        text = self._strip_stop(self.renderer.decode(out.token_ids), out, req)
        parsed = (parse_tool_calls(text, [t["function"]["name"] for t in tools]) if tools
                  else ParsedCompletion(text, []))
        if episode is not None:
            turn = ChatTurn(keys, tools_key, canonical(parsed.message()))
            self._record(episode, index, prompt, out, chat=turn, tool_calls=len(parsed.tool_calls),
                         malformed=parsed.malformed)
        finish = "tool_calls" if parsed.tool_calls else out.finish_reason
        choice: dict[str, Any] = {"index": 0, "message": parsed.openai_message(), "finish_reason": finish,
                                  "logprobs": self._chat_logprobs(out) if req.logprobs else None}
        return self._response("chat.completion", "chatcmpl", choice, prompt, out, req)

    async def complete(self, body: dict[str, Any], episode: EpisodeCapture | None) -> dict[str, Any]:
        self._check_model(body)
        policy = episode.policy if episode is not None else self.policy
        req = request_sampling(body, policy, chat=False)
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
            raw = raw[0]  # a batch of one
        if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            prompt, prompt_text = [int(t) for t in raw], None  # token-in: the ids as given
        elif isinstance(raw, str) and raw:
            prompt_text, prompt = raw, None
            found = episode.completion_continuation(raw) if episode is not None else None
            if found is not None:
                rec, rest = found
                prompt = [*rec.call.prompt_ids, *rec.call.completion_ids, *self.renderer.encode(rest)]
            if prompt is None:
                prompt = [int(t) for t in self.renderer.tokenizer.encode(raw)]
        else:
            raise EndpointError("prompt must be one non-empty string or one non-empty list of token ids "
                                "(one prompt per request)", param="prompt")
        vocab = len(self.renderer.tokenizer)
        if any(t < 0 or t >= vocab for t in prompt):
            raise EndpointError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        out, index = await self._sample(prompt, req, policy, episode)
        text = self._strip_stop(self.renderer.decode(out.token_ids), out, req)
        if episode is not None:
            exact = text == self.renderer.tokenizer.decode(out.token_ids, skip_special_tokens=False)
            turn = CompletionTurn(prompt_text, text) if prompt_text is not None and exact else None
            self._record(episode, index, prompt, out, completion=turn)
        choice = {"index": 0, "text": text, "finish_reason": out.finish_reason,
                  "logprobs": self._completion_logprobs(out) if req.logprobs else None}
        return self._response("text_completion", "cmpl", choice, prompt, out, req)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "rllib_spear"}]}

    # ------------------------------------------------------------------ pieces
    def _check_model(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise EndpointError("the request body must be a JSON object")
        model = body.get("model")
        if model != self.model_name:
            raise EndpointError(f"model {model!r} is not served here; this endpoint serves {self.model_name!r} "
                                "(.env_runners(serve_openai={'model_name': ...}) renames it)", status=404,
                                param="model", code="model_not_found")

    async def _sample(self, prompt: list[int], req: RequestSampling, policy: SamplingPolicy,
                      episode: EpisodeCapture | None) -> tuple[GenerationOutput, int | None]:
        room = policy.max_model_len - len(prompt)
        if room < policy.min_generation_tokens:
            if episode is not None:
                episode.context_refusals += 1
            raise EndpointError(f"the prompt has {len(prompt)} tokens; with max_model_len={policy.max_model_len} that "
                                f"leaves {room} to generate, less than {policy.min_generation_tokens} "
                                "(shorten the conversation, or raise .env_runners(max_model_len=...))",
                                param="messages", code="context_length_exceeded")
        cap = min(room, req.sampling.max_new_tokens, req.max_tokens or room)
        index = seed = None
        if episode is not None:
            index = episode.reserve()
            if index is None:
                raise EndpointError(f"episode {episode.episode_id} has ended; its calls are no longer recorded",
                                    status=404, code="episode_ended")
            seed = request_seed(episode.seed, episode.index, index)
        gauge = episode.engine_gauge if episode is not None and episode.engine_gauge is not None \
            else contextlib.nullcontext()
        try:
            with gauge:
                out = await self.engine.agenerate(prompt, req.sampling, cap, seed=seed)
        except BaseException:
            if index is not None:
                episode.release(index)
            raise
        return out, index

    def _record(self, episode: EpisodeCapture, index: int | None, prompt: Sequence[int], out: GenerationOutput, *,
                chat: ChatTurn | None = None, completion: CompletionTurn | None = None, tool_calls: int = 0,
                malformed: int = 0) -> None:
        call = CapturedCall(tuple(int(t) for t in prompt), tuple(int(t) for t in out.token_ids),
                            tuple(float(x) for x in out.logprobs), out.policy_version)
        closed = out.finish_reason == "stop" and bool(out.token_ids) and out.token_ids[-1] == self.renderer.eos_id
        episode.record(index, CallRecord(call, out.finish_reason, closed, tool_calls, malformed, chat, completion))

    @staticmethod
    def _strip_stop(text: str, out: GenerationOutput, req: RequestSampling) -> str:
        """OpenAI leaves the stop string that ended a completion out of its text (the trained
        tokens keep it)."""
        if out.finish_reason == "stop":
            for s in req.sampling.stop:
                if text.endswith(s):
                    return text[:-len(s)]
        return text

    def _token_strings(self, ids: Sequence[int]) -> list[str]:
        return [self.renderer.tokenizer.decode([t]) for t in ids]

    def _chat_logprobs(self, out: GenerationOutput) -> dict[str, Any]:
        return {"content": [{"token": s, "logprob": lp, "bytes": list(s.encode("utf-8")), "top_logprobs": []}
                            for s, lp in zip(self._token_strings(out.token_ids), out.logprobs)]}

    def _completion_logprobs(self, out: GenerationOutput) -> dict[str, Any]:
        return {"tokens": self._token_strings(out.token_ids), "token_logprobs": list(out.logprobs),
                "top_logprobs": None, "text_offset": None}

    def _response(self, obj: str, prefix: str, choice: dict[str, Any], prompt: Sequence[int], out: GenerationOutput,
                  req: RequestSampling) -> dict[str, Any]:
        if req.return_token_ids:
            choice["token_ids"] = list(out.token_ids)
        resp = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()),
                "model": self.model_name, "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out.token_ids),
                          "total_tokens": len(prompt) + len(out.token_ids)}}
        if req.return_token_ids:
            resp["prompt_token_ids"] = list(prompt)
        return resp
