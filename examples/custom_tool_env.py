"""Your own tool environment, tools and reward, trained with SPEAR through Ray Tune.

Run it (CPU, a few minutes; the embedded tiny model, 2 remote env runners)::

    python examples/custom_tool_env.py                      # env given as the class
    python examples/custom_tool_env.py --env-as path        # ... as "module:CityFactsEnv"
    python examples/custom_tool_env.py --env-as name        # ... as a name from register_env
    python examples/custom_tool_env.py --tasks parquet      # tasks from a parquet file

What it shows:

* two plain Python functions (type hints + docstring) become the tools of a
  :class:`~rllib_spear.envs.FunctionToolEnv`; the env lists them as JSON schemas in its system
  prompt, runs the model's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` calls, and
  scores the final ``<answer>`` by exact match against ``task["answer"]``;
* :class:`CityFactsEnv` fixes those tools in a ToolEnv subclass, so the env can be given to the
  config in each of the three ways (``--env-as``): the class itself, its import path, or a name
  registered with ``rllib_spear.register_env``. Remote env runners resolve it themselves
  (rllib_spear/envs/registry.py says how each form travels);
* the tasks are a list of dicts (or a parquet file written to a temp dir) given as ``dataset=``;
* a user reward function ``fn(task, response, stats) -> float`` added with
  ``.training(reward_fns=[...])``: its value is a named reward component,
  ``reward_fns/tidy_answer``, reported as ``env_runners/reward_fns/tidy_answer_mean``.

The tiny embedded model was trained on another task, so it rarely calls these tools: the point is
the plumbing, not the learning curve. Use a real model path for the latter.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from rllib_spear import register_env
from rllib_spear.envs import FunctionToolEnv

# ----------------------------------------------------------------------------- the tools
CITIES = {
    "Veloria": {"country": "Arden", "river": "Sel", "population": 120_000},
    "Quenth": {"country": "Arden", "river": "Ombre", "population": 45_000},
    "Marrow": {"country": "Tessaly", "river": "Sel", "population": 310_000},
    "Istel": {"country": "Tessaly", "river": "Vane", "population": 8_000},
    "Panoth": {"country": "Orlen", "river": "Ombre", "population": 97_000},
}


def lookup_city(city: str) -> dict:
    """Facts about a city: its country, its river and its population.

    Args:
        city: the city's name, e.g. "Veloria"
    """
    return CITIES[city.strip().title()]  # an unknown city raises KeyError: the model sees the error


def population_difference(city_a: str, city_b: str) -> int:
    """How many more people live in city_a than in city_b (negative if fewer).

    Args:
        city_a: the first city's name
        city_b: the second city's name
    """
    return lookup_city(city_a)["population"] - lookup_city(city_b)["population"]


class CityFactsEnv(FunctionToolEnv):
    """The two tools above as one environment class (``cls(**env_config)``)."""

    def __init__(self, max_turns: int = 3, **kwargs: Any):
        super().__init__(tools=[lookup_city, population_difference], max_turns=max_turns, **kwargs)


def make_tasks() -> list[dict]:
    """Questions answered from the table (task dicts: ``question``, ``answer``)."""
    tasks = []
    for city, facts in CITIES.items():
        tasks.append({"question": f"Which river flows through {city}?", "answer": facts["river"]})
        tasks.append({"question": f"In which country is {city}?", "answer": facts["country"]})
    tasks.append({"question": "How many more people live in Marrow than in Veloria?",
                  "answer": str(population_difference("Marrow", "Veloria"))})
    return tasks


# ----------------------------------------------------------------------------- the user reward
def tidy_answer(task: dict, response: str, stats) -> float:
    """+0.1 for a final answer of at most five words, -0.05 per failed tool call (a counter of
    this env's own, read from ``stats.extra``)."""
    short = stats.has_answer and len(str(stats.extra["answer"]).split()) <= 5
    return (0.1 if short else 0.0) - 0.05 * stats.extra["tool_errors"]


# ----------------------------------------------------------------------------- the env spec
ENV_NAME = "city_facts"
# The module to import CityFactsEnv from: this file's name when run as a script (its directory is
# on the workers' sys.path: Ray adds the driver script's directory), else the importing name.
MODULE = Path(__file__).stem if __name__ == "__main__" else __name__
ENV_AS = ("class", "path", "name")


def env_spec(env_as: str) -> Any:
    """CityFactsEnv given one of three ways: the class, its import path, or a registered name."""
    if env_as == "class":
        return CityFactsEnv
    if env_as == "path":
        return f"{MODULE}:CityFactsEnv"
    if env_as == "name":
        register_env(ENV_NAME, CityFactsEnv, override=True)  # also registered with Ray Tune
        return ENV_NAME
    raise ValueError(f"env_as must be one of {ENV_AS}, got {env_as!r}")


def write_parquet(tasks: list[dict], folder: str | os.PathLike) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(folder) / "train.parquet"
    pq.write_table(pa.Table.from_pylist(tasks), path)
    return str(path)


def build_config(env_as: str = "class", *, tasks: str = "list", num_env_runners: int = 2,
                 model_path: str = "embedded", data_dir: str | os.PathLike | None = None):
    """A SPEAR config sized for CPU: tiny groups, short turns, no separate learner process."""
    from rllib_spear import SPEARConfig

    rows = make_tasks()
    if tasks == "parquet":
        dataset: Any = write_parquet(rows, data_dir or tempfile.mkdtemp(prefix="city_facts_"))
    elif tasks == "list":
        dataset = rows
    else:
        raise ValueError(f"tasks must be 'list' or 'parquet', got {tasks!r}")
    return (SPEARConfig()
            .environment(env_spec(env_as), dataset=dataset)
            .env_runners(num_env_runners=num_env_runners, num_cpus_per_env_runner=0.5, max_turns=2,
                         max_new_tokens=24, max_model_len=1536, max_response_tokens=256)
            .training(group_size=4, tasks_per_iteration=2, lr=1e-4, reward_fns=[tidy_answer],
                      # an untrained model rarely answers: keep its responses trainable
                      response_filters=(), group_filter_keep_fraction=None)
            .learners(num_learners=0)
            .rl_module(model_config={"model_path": model_path})
            .debugging(seed=0))


def _progress_callback(results: list[dict], verbose: bool):
    from ray import tune

    class Progress(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            r = result["env_runners"]
            results.append(result)
            if verbose:
                print(f"iteration {result['training_iteration']}: reward {r['reward_total_mean']:.3f} "
                      f"(outcome {r['reward_outcome_mean']:.3f}, tidy_answer "
                      f"{r.get('reward_fns/tidy_answer_mean', float('nan')):.3f}), tool calls per "
                      f"episode {r['tool_calls_per_episode']:.2f}, episodes {int(r['num_episodes'])}", flush=True)

    return Progress()


def train(env_as: str = "class", *, iterations: int = 2, tasks: str = "list", num_env_runners: int = 2,
          model_path: str = "embedded", storage_path: str | os.PathLike | None = None,
          verbose: bool = True) -> list[dict]:
    """Train SPEAR on CityFactsEnv with Ray Tune for ``iterations`` iterations; returns the
    results of every iteration (raises if the trial failed). Ray must be initialised (or Tune
    starts a local instance)."""
    from ray import tune

    storage = Path(storage_path or tempfile.mkdtemp(prefix="city_facts_runs_"))
    config = build_config(env_as, tasks=tasks, num_env_runners=num_env_runners, model_path=model_path,
                          data_dir=storage)
    results: list[dict] = []
    if verbose:
        print(f"training SPEAR on {config.env!r} (env given as {env_as}), {iterations} iterations", flush=True)
    grid = tune.Tuner("SPEAR", param_space=config, run_config=tune.RunConfig(
        stop={"training_iteration": iterations}, storage_path=str(storage / "tune"), verbose=0,
        callbacks=[_progress_callback(results, verbose)])).fit()
    if grid.errors:
        raise RuntimeError(f"training failed: {grid.errors[0]}")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env-as", choices=ENV_AS, default="class", help="how the config names the env")
    p.add_argument("--tasks", choices=("list", "parquet"), default="list", help="tasks as a list or a parquet file")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--num-env-runners", type=int, default=2)
    p.add_argument("--model-path", default="embedded", help="a local HF model folder or 'embedded'")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False)
    results = train(args.env_as, iterations=args.iterations, tasks=args.tasks,
                    num_env_runners=args.num_env_runners, model_path=args.model_path)
    print(f"done: {len(results)} iterations, last reward {results[-1]['env_runners']['reward_total_mean']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
