"""One GRPO training step, this library against TRL's ``GRPOTrainer``, on the same models and batch,
in one process, the two sides alternating.

Install TRL (a benchmark dependency only, never one of the library)::

    .venv/bin/pip install -e ".[bench-trl]"      # trl==1.16.0 (+ datasets), torch/transformers kept

(the ``test`` extra installs it too, so that CI runs the ``--quick`` form:
tests/benchmarks/test_vs_trl.py).

Run::

    .venv/bin/python benchmarks/vs_trl.py             # both models, 3 alternations x 3 timed steps
    .venv/bin/python benchmarks/vs_trl.py --quick     # the small model, 1 alternation x 1 step (a test)

The work of one step, equal on both sides:

* models: random-init Qwen2 (untied head, fp32, SDPA), vocabulary 2000 (a byte-level BPE trained
  on seeded pseudo-words, so every sampled id decodes): ``0.94M`` (hidden 128, 2 layers) and
  ``5.3M`` (hidden 256, 5 layers), built once and cached under ``$RLLIB_SPEAR_CACHE``;
* batch: 8 prompts x 8 samples, one assistant turn of at most 64 new tokens (temperature 1, no
  top-p / top-k), the same chat template; reward: the same function of the completion text;
* update: one optimizer step per iteration (TRL: ``per_device_train_batch_size`` 64, one
  gradient-accumulation step, ``num_iterations`` 1; ours: one mini-batch), AdamW lr 1e-6, betas
  (0.9, 0.999), weight decay 0.01, gradient clipping at 1.0, beta = 0 (no reference model), the
  Dr. GRPO loss (TRL ``loss_type="dr_grpo"``: token sums over 64 x ``max_completion_length``;
  ours ``loss_agg_mode="seq-mean-token-sum-norm"`` with ``t_norm`` 64), clip epsilon 0.2, group
  advantages without std scaling (TRL ``scale_rewards="none"``; ours ``advantage_estimator="grpo"``
  with its group-mean baseline);
* TRL: no vLLM, gradient checkpointing off, CPU, its default optimizer, no logging to a service.
  Ours: ``GRPOConfig`` built in process, a local env runner (``num_env_runners=0``, HF engine)
  and a local learner (``num_learners=0``); Ray starts lean (``cluster/local_ray.py``).

What differs, and why it is left so: each side keeps its own generation loop (TRL: one
``model.generate`` over the 64 prompts; ours: the HF engine's batched decode) and its own
metrics (TRL computes the entropy of every completion token for its log; ours samples at most
``entropy_metric_tokens`` loss tokens). TRL scores the completion with the old policy only when
``num_iterations > 1`` (here the old log-probs are the detached current ones); ours uses the
engine's sampling log-probs (no extra forward, ``recompute_old_logprobs`` off), so neither side
runs an extra forward.

Precision (``--precision``, default ``auto``): both sides compute in the same precision. ``fp32``:
float32 everywhere (TRL ``bf16=False``). ``bf16``: TRL's default ``bf16=True`` (autocast over
float32 weights, its generation included), ours ``.learners(mixed_precision="bf16")`` (float32
master weights, bf16 autocast) with a bf16 HF engine, and the bare loop under the same autocast.
``auto``: ``bf16`` on a CPU that computes bf16 in hardware (AVX-512 BF16, AMX, aarch64 BF16;
``rllib_spear.models.precision``), ``fp32`` elsewhere, where bf16 would be emulated and slower on
both sides.

Reported per side (medians over every timed step of every alternation, with min-max spread):
step time; generated tokens/s (completion tokens / generation time); trained tokens/s (prompt +
completion tokens of the update / the step less its generation, on both sides: the update and
the rest of the driver's work, since TRL's update cannot be timed apart); end-to-end tokens/s
(completion tokens / step time); the ratios ours / TRL; and our learner update alone
(``GRPO.update_learners``) against a bare torch loop on the same batch
(``learner_throughput.bench_bare``: HF body, log-softmax gather on the completion positions,
backward, clipping, fused AdamW), in trained tokens/s: the bare loop runs on the batch of each of
our timed steps right after it (paired), and the ratio is the median of the per-step ratios. ``--cpu-time --threads 1`` times with
the process's CPU time instead of the wall clock, for a machine other jobs share.
Targets: end-to-end >= 1.3x TRL on both models (issue 33, "An asynchronous agent loop"; 1.2x
before, issue "Faster than TRL per training step"), trained >= 0.9x bare torch.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

#: The two models of the comparison (untied head: the issue's 0.94M has 2 x 2000 x 128 head and
#: embedding parameters).
MODELS = {
    "0.94M": dict(hidden=128, layers=2, heads=4, intermediate=384),
    "5.3M": dict(hidden=256, layers=5, heads=4, intermediate=768),
}
VOCAB = 2000
PROMPTS, SAMPLES, NEW_TOKENS, LR = 8, 8, 64, 1e-6
#: ours / TRL end-to-end tokens/s to reach on both models, and ours / bare torch trained tokens/s.
END_TO_END_TARGET, BARE_TARGET = 1.3, 0.9
#: ``--precision`` choices; the resolved one (``resolve_precision``) is set in ``main``.
PRECISIONS = ("auto", "fp32", "bf16")
PRECISION = "fp32"
#: The clock of every timing: wall time, or with ``--cpu-time`` this process's CPU time (with
#: ``--threads 1``: the work done, unaffected by other jobs on a shared machine).
CLOCK = time.perf_counter
_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["th", "sh", "qu", "x", "y"]


def resolve_precision(name: str, flags=None) -> str:
    """``--precision``: "fp32" or "bf16" as given; "auto" -> "bf16" where the CPU computes bf16 in
    hardware (``flags``: the CPU flags to judge by, default this machine's), else "fp32"."""
    from rllib_spear.models.precision import cpu_has_native_bf16

    if name not in PRECISIONS:
        raise ValueError(f"--precision: unknown precision {name!r}; choose from {', '.join(PRECISIONS)}")
    if name != "auto":
        return name
    return "bf16" if cpu_has_native_bf16(flags) else "fp32"


def _bf16_autocast(on: bool):
    import contextlib

    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


# ---------------------------------------------------------------------- models and prompts
def pseudo_words(n: int, seed: int = 0) -> list[str]:
    """``n`` lines of seeded pseudo-words (1-4 syllables each): enough distinct pieces for a BPE
    of 2000 tokens, where the project's synthetic conversations saturate near 500."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        words = ["".join(rng.choice(_SYLLABLES, int(rng.integers(1, 5)))) for _ in range(int(rng.integers(6, 14)))]
        lines.append(" ".join(words).capitalize() + ".")
    return lines


def model_path(name: str) -> str:
    """The cached random-init Qwen2 ``name`` of :data:`MODELS` with its 2000-token tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rllib_spear.cache_paths import cache_root
    from rllib_spear.models.factory import atomic_build_dir
    from rllib_spear.models.tokenizer import train_chat_tokenizer

    spec = MODELS[name]
    key = hashlib.sha256(json.dumps({**spec, "vocab": VOCAB, "v": 1}, sort_keys=True).encode()).hexdigest()[:16]
    final = cache_root() / f"bench-vs-trl-{name}-{key}"
    if (final / "config.json").exists():
        return str(final)
    tok = train_chat_tokenizer(pseudo_words(20000), vocab_size=VOCAB)
    h = spec["hidden"]
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=h, intermediate_size=spec["intermediate"],
                      num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                      num_key_value_heads=spec["heads"], head_dim=h // spec["heads"], max_position_embeddings=1024,
                      tie_word_embeddings=False, rms_norm_eps=1e-6, bos_token_id=None,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).float()
    with atomic_build_dir(final) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return str(final)


def questions(n: int, seed: int = 1) -> list[str]:
    return [f"Question {i}: {line}" for i, line in enumerate(pseudo_words(n, seed))]


def reward_of(text: str) -> float:
    """The reward of a completion on both sides: any deterministic spread of values will do (it
    only has to give the groups nonzero advantages)."""
    return (len(text) % 5) / 4.0


# ---------------------------------------------------------------------- timing records
@dataclass
class Step:
    step_s: float
    gen_s: float  # generation (TRL: ``_generate``; ours: ``GRPO.next_batch``, the pipeline's batch)
    update_s: float  # ours: ``GRPO.update_learners``; TRL: not separable, = step_s - gen_s
    generated: int  # completion tokens
    trained: int  # prompt + completion tokens of the update


@dataclass
class Side:
    name: str
    steps: list[Step] = field(default_factory=list)

    def rates(self) -> dict[str, list[float]]:
        return {"step_s": [s.step_s for s in self.steps],
                "generated_tok_s": [s.generated / s.gen_s for s in self.steps],
                # everything but generation, on both sides: the update and the driver's work
                "trained_tok_s": [s.trained / (s.step_s - s.gen_s) for s in self.steps],
                "update_tok_s": [s.trained / s.update_s for s in self.steps],
                "end_to_end_tok_s": [s.generated / s.step_s for s in self.steps]}


# ---------------------------------------------------------------------- ours
def single_turn_env_class():
    """A ``ToolEnv`` class: the question as the only user message, one assistant turn, the reward."""
    from rllib_spear.core.episode import EpisodeStats
    from rllib_spear.envs import StepResult, ToolEnv

    class OneTurnEnv(ToolEnv):
        """The question as the only user message; one assistant turn ends the episode."""

        def __init__(self, **_):
            self.reward = 0.0

        @property
        def system_prompt(self) -> str:
            return ""

        def reset(self, task):
            self.reward = 0.0
            return [{"role": "user", "content": task["question"]}]

        def step(self, assistant_text):
            self.reward = reward_of(assistant_text)
            return StepResult(None, self.reward, True)

        def episode_stats(self):
            return EpisodeStats(success=self.reward > 0.5, outcome_reward=self.reward, tool_calls=0,
                                queries_per_step=[0], format_ok=True, has_answer=True)

    return OneTurnEnv


class Ours:
    """This library's GRPO, built in process (local runner, local learner)."""

    def __init__(self, path: str, prompts: list[str]):
        from rllib_spear import GRPOConfig

        self.path = path
        bf16 = PRECISION == "bf16"
        self.config = (GRPOConfig()
                       .environment(single_turn_env_class(), dataset=[{"question": q, "answer": ""} for q in prompts])
                       .env_runners(num_env_runners=0, engine="hf", temperature=1.0, top_p=1.0, top_k=-1,
                                    max_turns=1, max_new_tokens=NEW_TOKENS, max_response_tokens=NEW_TOKENS,
                                    engine_kwargs={"dtype": "bfloat16"} if bf16 else {})
                       .training(group_size=SAMPLES, tasks_per_iteration=PROMPTS, lr=LR, grad_clip=1.0,
                                 loss_agg_mode="seq-mean-token-sum-norm", t_norm=NEW_TOKENS, weight_decay=0.01,
                                 clip_ratio_low=0.2, clip_ratio_high=0.2, kl_coeff=0.0, entropy_coeff=0.0)
                       .learners(num_learners=0, mixed_precision="bf16" if bf16 else None)
                       .rl_module(model_config={"model_path": path})
                       .debugging(seed=0))
        self.algo = self.config.build_algo()
        self.rows: list = []
        self._gen_s = self._train_s = 0.0
        next_batch, update = self.algo.next_batch, self.algo.update_learners

        # Timed on the instance (the same clock as TRL's side); the last update's rows are kept
        # for the bare-torch reference.
        def timed_next_batch(*a, **kw):  # the rollout pipeline's batch (sampling, rewards, filters)
            t0 = CLOCK()
            out = next_batch(*a, **kw)
            self._gen_s += CLOCK() - t0
            return out

        def timed_update(rows, step):
            self.rows = list(rows)
            t0 = CLOCK()
            out = update(rows, step)
            self._train_s += CLOCK() - t0
            return out

        self.algo.next_batch, self.algo.update_learners = timed_next_batch, timed_update

    def step(self) -> Step:
        self._gen_s = self._train_s = 0.0
        t0 = CLOCK()
        self.algo.train()
        wall = CLOCK() - t0
        generated = int(sum(float(np.sum(r.loss_mask)) for r in self.rows))
        trained = int(sum(int(r.traj.length) for r in self.rows))
        return Step(wall, self._gen_s, self._train_s, generated, trained)

    def close(self) -> None:
        self.algo.stop()


# ---------------------------------------------------------------------- TRL
class TRL:
    """TRL's ``GRPOTrainer`` on the same model folder, prompts and reward; its generation timed by
    a subclass around ``_generate`` and its steps by a callback."""

    def __init__(self, path: str, prompts: list[str]):
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from trl import GRPOConfig as TRLConfig
        from trl import GRPOTrainer

        side = self
        self.tok = AutoTokenizer.from_pretrained(path)
        self.steps: list[Step] = []
        self._gen_s = 0.0
        self._gen_tokens = 0
        self._trained = 0
        self._t0 = 0.0

        class Timed(GRPOTrainer):
            def _generate(self, prompts):  # noqa: D401 - TRL's generation of one step
                t0 = CLOCK()
                out = super()._generate(prompts)
                side._gen_s += CLOCK() - t0
                return out

        class Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                side._gen_s, side._gen_tokens, side._trained = 0.0, 0, 0
                side._t0 = CLOCK()

            def on_step_end(self, args, state, control, **kw):
                wall = CLOCK() - side._t0
                side.steps.append(Step(wall, side._gen_s, wall - side._gen_s, side._gen_tokens, side._trained))

        def reward(prompts, completions, completion_ids, **kw):
            side._gen_tokens += sum(len(c) for c in completion_ids)
            for p, c in zip(prompts, completion_ids):
                side._trained += len(self.tok.apply_chat_template(p, add_generation_prompt=True,
                                                                  tokenize=True, return_dict=False)) + len(c)
            return [reward_of(_text(c)) for c in completions]

        self.args = dict(output_dir=os.path.join(_tmpdir(), "trl"), per_device_train_batch_size=PROMPTS * SAMPLES,
                         gradient_accumulation_steps=1, num_generations=SAMPLES, max_completion_length=NEW_TOKENS,
                         learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01,
                         adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0, beta=0.0, loss_type="dr_grpo",
                         scale_rewards="none", epsilon=0.2, num_iterations=1, temperature=1.0, top_p=1.0,
                         top_k=0, use_vllm=False, gradient_checkpointing=False, bf16=PRECISION == "bf16", fp16=False,
                         use_cpu=True, report_to="none", save_strategy="no", logging_steps=10_000,
                         disable_tqdm=True, dataloader_num_workers=0, seed=0)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        data = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in prompts])
        self._make = lambda steps: Timed(model=model, reward_funcs=reward, processing_class=self.tok,
                                         args=TRLConfig(**self.args, max_steps=steps), train_dataset=data,
                                         callbacks=[Clock()])

    def run(self, steps: int) -> list[Step]:
        """``steps`` training steps (one ``train()`` call); their records."""
        self.steps = []
        self._make(steps).train()
        return self.steps


def _text(completion) -> str:
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return "".join(m.get("content", "") for m in completion)
    return str(completion)


def _tmpdir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="vs-trl-")


# ---------------------------------------------------------------------- bare torch
class Bare:
    """The bare torch loop (``learner_throughput.bench_bare``) on its own copy of the model, run on
    the batch of each of our timed steps right after it: the two learners are compared on the same
    batch at the same moment, so a drift of the machine's speed between steps cancels."""

    def __init__(self, path: str, iters: int):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.iters = iters

    def trained_tok_s(self, ours: Ours) -> float:
        """Trained tokens/s (median over ``iters`` timed updates after one warm-up) on ``ours``'s last batch."""
        from learner_throughput import bench_bare, learner_batch

        with _bf16_autocast(PRECISION == "bf16"):  # the precision of both sides' updates
            tokens, times, _ = bench_bare(self.model, learner_batch(ours.rows, ours.config), ours.config,
                                          self.iters, clock=CLOCK)
        return tokens / float(np.median(times))


# ---------------------------------------------------------------------- report
def _med(xs: list[float]) -> str:
    return f"{statistics.median(xs):9.2f} ({min(xs):.2f}-{max(xs):.2f})"


def compare(name: str, alternations: int, steps: int, bare_iters: int) -> dict[str, float]:
    """Build both sides on model ``name``, alternate them; print and return the medians and ratios."""
    path = model_path(name)
    n_params = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(path).parameters())
    prompts = questions(PROMPTS * 8)
    trl, ours = TRL(path, prompts), Ours(path, prompts)
    bare_side = Bare(path, bare_iters)
    sides = {"trl": Side("TRL GRPOTrainer"), "ours": Side("rllib_spear GRPO")}
    bare_tok_s: list[float] = []  # the bare loop on the batch of each of our timed steps
    ours.step()  # warm-up (first generate / first update), not timed
    bare_side.trained_tok_s(ours)
    trl.run(1)
    for a in range(alternations):
        # each train() call's first step builds TRL's optimizer and dataloader: dropped
        sides["trl"].steps += trl.run(steps + 1)[1:]
        for _ in range(steps):
            sides["ours"].steps.append(ours.step())
            bare_tok_s.append(bare_side.trained_tok_s(ours))
        print(f"  [{name}] alternation {a + 1}/{alternations} done", flush=True)
    ours.close()
    print(f"\nmodel {name}: {n_params / 1e6:.2f}M parameters, vocab {VOCAB}, {PRECISION}; {PROMPTS} prompts x {SAMPLES} "
          f"samples x <= {NEW_TOKENS} new tokens; {alternations} alternations x {steps} steps; torch threads "
          f"{torch.get_num_threads()}")
    print(f"{'':18s} {'step s':>22s} {'generated tok/s':>22s} {'trained tok/s':>22s} {'end-to-end tok/s':>22s}")
    rates = {k: s.rates() for k, s in sides.items()}
    for k, s in sides.items():
        r = rates[k]
        print(f"{s.name:18s} {_med(r['step_s']):>22s} {_med(r['generated_tok_s']):>22s} "
              f"{_med(r['trained_tok_s']):>22s} {_med(r['end_to_end_tok_s']):>22s}")
    med = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in rates.items()}
    out = {f"ours_over_trl_{m}": med["ours"][m] / med["trl"][m]
           for m in ("generated_tok_s", "trained_tok_s", "end_to_end_tok_s")}
    # paired: our update over the bare loop on the same batch, step by step; the median of those
    paired = [o / b for o, b in zip(rates["ours"]["update_tok_s"], bare_tok_s)]
    out["ours_over_bare_trained"] = statistics.median(paired)
    out["trl_step_s"], out["ours_step_s"] = med["trl"]["step_s"], med["ours"]["step_s"]
    print(f"bare torch loop    trained {_med(bare_tok_s)} tok/s; our learner update alone "
          f"{_med(rates['ours']['update_tok_s'])} tok/s; per step ours / bare {_med(paired)}")
    print(f"ours / TRL: generated {out['ours_over_trl_generated_tok_s']:.2f}x, trained "
          f"{out['ours_over_trl_trained_tok_s']:.2f}x, end-to-end {out['ours_over_trl_end_to_end_tok_s']:.2f}x "
          f"(target >= {END_TO_END_TARGET}x: "
          f"{'OK' if out['ours_over_trl_end_to_end_tok_s'] >= END_TO_END_TARGET else 'BELOW'})")
    print(f"ours / bare torch trained: {out['ours_over_bare_trained']:.2f}x "
          f"(target >= {BARE_TARGET}x: {'OK' if out['ours_over_bare_trained'] >= BARE_TARGET else 'BELOW'})",
          flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated names of MODELS")
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per side and alternation")
    ap.add_argument("--quick", action="store_true", help="the small model, 1 alternation x 1 step")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with this process's CPU time (use with --threads 1 on a busy machine)")
    ap.add_argument("--precision", default="auto", choices=PRECISIONS,
                    help="both sides' compute precision (auto: bf16 where the CPU has it in hardware, else fp32)")
    args = ap.parse_args(argv)
    global CLOCK, PRECISION
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    PRECISION = resolve_precision(args.precision)
    print(f"precision: {PRECISION} (--precision {args.precision})", flush=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [n for n in args.models.split(",") if n]
    for n in names:
        if n not in MODELS:
            raise ValueError(f"--models: unknown model {n!r}; choose from {', '.join(MODELS)}")
    if args.quick:
        names, args.alternations, args.steps = names[:1], 1, 1
    return {n: compare(n, args.alternations, args.steps, bare_iters=1 if args.quick else 3) for n in names}


if __name__ == "__main__":
    main()
