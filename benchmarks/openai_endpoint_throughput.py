"""The cost of HTTP per call: an agent program through the env runner's OpenAI endpoint vs the same
task in the in-process async agent loop.

The task is a chat loop of ``--turns`` calls per episode: the question as a user message, then,
after every reply, the user turn ``"go on"``. Three paths run it on one engine:

* ``inproc``: the async agent loop (``rollout_mode="async"``, ``AsyncMultiTurnRollout``) with a
  ``ToolEnv`` whose every step returns ``"go on"`` (rendered by the ``chatml`` observation
  template: the same tokens as the chat template writes for that user turn);
* ``http_sync``: ``rollout_mode="agent_program"`` with a plain ``def`` program and an
  ``openai.OpenAI`` client on a worker thread per episode;
* ``http_async``: the same with an ``async def`` program and ``openai.AsyncOpenAI`` on the agent loop.

The endpoint continues every reply from its sampled ids, so the three send the engine the same
first prompts with the same request seeds (``request_seed``), and the same later ones up to one
token: after a reply cut at ``--max-new`` tokens the endpoint closes the turn with the template's
end-of-turn token, which the in-process ``chatml`` observation does not write. The engine work is
about the same, and the difference in wall time is the endpoint's (HTTP, JSON, templating the new
messages, the program's client, and the batches the engine forms from requests that arrive one by
one). Per path: episodes/s, calls/s, generated tokens/s (totals over ``--reps`` reps after a
warm-up, paths alternating), the engine's batches (HF engine: mean requests per ``generate``),
and the HTTP cost per call = (wall(http) - wall(inproc)) / calls.
``--engine scripted`` replaces the model by one that answers every request with ``--max-new``
fixed tokens at once (no decode time), which isolates the per-call cost of each path.

    .venv/bin/python benchmarks/openai_endpoint_throughput.py [--engine hf|scripted] [--model tiny|embedded|PATH]
        [--tasks 8 --group 4 --turns 3 --max-new 16 --reps 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

PATHS = ("inproc", "http_sync", "http_async")


def chat_loop_env(turns: int):
    """The in-process twin of the program: ``turns`` steps, each observation ``"go on"``."""
    from rllib_spear.envs.base import StepResult, ToolEnv

    class ChatLoopEnv(ToolEnv):
        def reset(self, task):
            self.task, self.n = task, 0
            return [{"role": "user", "content": task["question"]}]

        def step(self, text):
            self.n += 1
            if self.n >= turns:
                return StepResult(None, 1.0, True)
            return StepResult("go on", 0.0, False)

        def episode_stats(self):
            return {"success": True, "outcome_reward": 1.0, "tool_calls": 0, "queries_per_step": [],
                    "format_ok": True, "has_answer": True}

    return ChatLoopEnv


def programs(turns: int, max_new: int):
    def chat(task, client):
        messages = [{"role": "user", "content": task["question"]}]
        for _ in range(turns):
            reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=max_new)
            messages += [reply.choices[0].message, {"role": "user", "content": "go on"}]
        return 1.0

    async def achat(task, client):
        messages = [{"role": "user", "content": task["question"]}]
        for _ in range(turns):
            reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=max_new)
            messages += [reply.choices[0].message, {"role": "user", "content": "go on"}]
        return 1.0

    return chat, achat


def scripted_engine(tokenizer, n: int):
    """Answers every request with ``n`` fixed tokens (the last the end of turn), at once."""
    from rllib_spear.env_runners.engines.base import GenerationEngine, GenerationOutput

    ids = tokenizer.encode(" word" * 64, add_special_tokens=False)[: max(1, n - 1)] + [tokenizer.eos_token_id]

    class Scripted(GenerationEngine):
        def generate(self, prompts, sampling, max_new_tokens=None):
            caps = max_new_tokens or [sampling.max_new_tokens] * len(prompts)
            outs = []
            for cap in caps:
                out = ids[: int(cap)]
                outs.append(GenerationOutput(list(out), [-0.5] * len(out), "stop" if out[-1] == ids[-1] else "length"))
            return outs

        def update_weights(self, state_dict, version):
            self.version = version

    return Scripted()


def build(path_name, engine, tokenizer, args, endpoint):
    from rllib_spear.env_runners.agent_program_rollout import AgentProgramRollout
    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.env_runners.rollout import RolloutConfig
    from rllib_spear.env_runners.rollout_modes import make_rollout
    from rllib_spear.envs.agent_program import AgentProgramEnv

    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new, seed=0)
    config = RolloutConfig(max_turns=args.turns, max_model_len=args.max_model_len,
                           max_response_tokens=args.max_model_len - 64)
    if path_name == "inproc":
        return make_rollout("async", engine=engine, tokenizer=tokenizer, env_factory=chat_loop_env(args.turns),
                            sampling=sampling, config=config, step_timeout_s=None)
    chat, achat = programs(args.turns, args.max_new)
    program = chat if path_name == "http_sync" else achat
    return AgentProgramRollout(engine, tokenizer, lambda: AgentProgramEnv(program, episode_timeout_s=600),
                               sampling, config, endpoint=endpoint)


def run_once(rollout, engine, tasks, group, seed):
    sched = engine.batching_scheduler()
    batches0 = sched.batches
    rollout.sampling.seed = seed
    t0 = time.perf_counter()
    trajs, stats = rollout.run(tasks, group)
    wall = time.perf_counter() - t0
    errors = sum(t.rollout.error is not None for t in trajs)
    first = [t.segments[1].token_ids if t.num_steps else [] for t in trajs]  # the first reply: same prompt, seed
    return {"wall": wall, "episodes": len(trajs), "calls": stats.engine_calls, "tokens": stats.generated_tokens,
            "errors": errors, "first": first, "batches": sched.batches - batches0}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="hf", choices=("hf", "scripted"))
    ap.add_argument("--model", default="tiny", help="tiny | embedded | a model folder")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.env_runners.serving import OpenAIEndpoint

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rollout_throughput import model_path_of  # the same model names as the rollout benchmark

    path = model_path_of(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if args.engine == "hf":
        from rllib_spear.env_runners.engines.hf_engine import HFEngine

        engine = HFEngine(path)
    else:
        engine = scripted_engine(tokenizer, args.max_new)
    endpoint = OpenAIEndpoint(engine, tokenizer, SamplingConfig(max_new_tokens=args.max_new),
                              max_model_len=args.max_model_len).start()
    tasks = [{"uid": f"t{i}", "question": f"Tell me about the city number {i}."} for i in range(args.tasks)]
    rollouts = {p: build(p, engine, tokenizer, args, endpoint) for p in PATHS}
    print(f"engine={args.engine} model={path} tasks={args.tasks} x group={args.group} turns={args.turns} "
          f"max_new={args.max_new} reps={args.reps} torch threads={torch.get_num_threads()}")
    res = {p: [] for p in PATHS}
    try:
        for rep in range(args.reps + 1):  # rep 0 warms every path up
            order = PATHS if rep % 2 == 0 else PATHS[::-1]
            for p in order:
                r = run_once(rollouts[p], engine, tasks, args.group, seed=rep)
                if rep:
                    res[p].append(r)
        same = all(a["first"] == b["first"] == c["first"]
                   for a, b, c in zip(res["inproc"], res["http_sync"], res["http_async"]))
    finally:
        for p in PATHS[1:]:
            rollouts[p].shutdown()
        endpoint.stop()
        engine.shutdown()
    out = {}
    for p in PATHS:
        wall = sum(r["wall"] for r in res[p])
        calls, eps, toks, batches = (sum(r[k] for r in res[p]) for k in ("calls", "episodes", "tokens", "batches"))
        out[p] = {"wall": wall, "calls": calls, "episodes_per_s": eps / wall, "calls_per_s": calls / wall,
                  "tokens_per_s": toks / wall, "errors": sum(r["errors"] for r in res[p]),
                  "requests_per_batch": calls / max(1, batches)}
    base = out["inproc"]
    print(f"{'path':11s} {'episodes/s':>10s} {'calls/s':>8s} {'tok/s':>8s} {'wall s':>7s} {'req/batch':>9s} "
          f"{'HTTP ms/call':>12s} errors")
    for p in PATHS:
        o = out[p]
        o["http_ms_per_call"] = 0.0 if p == "inproc" else 1000 * (o["wall"] - base["wall"]) / o["calls"]
        print(f"{p:11s} {o['episodes_per_s']:10.2f} {o['calls_per_s']:8.1f} {o['tokens_per_s']:8.1f} {o['wall']:7.2f} "
              f"{o['requests_per_batch']:9.1f} {o['http_ms_per_call']:12.1f} {o['errors']}")
    print(f"the first reply of every episode is the same token for token on the three paths: {same}")
    out["same_first_replies"] = same
    return out


if __name__ == "__main__":
    main()
