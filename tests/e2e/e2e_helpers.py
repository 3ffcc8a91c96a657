"""Shared helpers of the end-to-end tests."""


def small_config(cls, model_path, **training):
    """A tiny, fast config of any of the algorithms on the embedded search task."""
    cfg = (cls().environment("search_qa")
           .env_runners(num_env_runners=1, max_new_tokens=16, max_turns=2, max_model_len=512,
                        max_response_tokens=256, num_cpus_per_env_runner=0.5)
           .training(**{"group_size": 4, "tasks_per_iteration": 2, "lr": 1e-4,
                      # an untrained model never answers: keep its responses trainable
                      "response_filters": (), "group_filter_keep_fraction": None, **training})
           .rl_module(model_config={"model_path": model_path})
           .debugging(seed=0))
    return cfg


def with_trajectory_hook(cfg, fn):
    """``cfg`` with a TrajectoryCallback that calls ``fn(trajectories, runner_stats, algorithm)``
    on every iteration's sampled batch (the public hook: read, edit in place, or replace the
    batch with ``trajectories[:] = ...``). The class is made here, so cloudpickle ships it by
    value to remote runners (test modules are not importable there)."""
    from rllib_spear.callbacks import TrajectoryCallback

    class Hook(TrajectoryCallback):
        def on_trajectories(self, *, algorithm, trajectories, runner_stats, step, **kwargs):
            fn(trajectories, runner_stats, algorithm)

    return cfg.callbacks(Hook)


def recorder(synthetic_rewards=False, seed=123, values=(0.0, 0.25, 1.0)):
    """(hook fn, calls): records every batch as (trajectories, runner_stats); with
    ``synthetic_rewards``, first gives each trajectory a seeded outcome reward from ``values``
    (an untrained tiny model rarely earns a reward, and all-equal rewards give zero advantages)."""
    import numpy as np

    calls = []

    def hook(trajs, stats, algorithm):
        if synthetic_rewards:
            rng = np.random.default_rng(seed)
            for t in trajs:
                t.outcome_reward = float(rng.choice(list(values)))
        calls.append((trajs, stats))

    return hook, calls


def replayer(batch):
    """A hook fn that replaces each sampled batch with a deep copy of ``batch``
    (= (trajectories, runner_stats)) while ``state["on"]`` is True; returns (hook fn, state)."""
    import copy

    state = {"on": True}

    def hook(trajs, stats, algorithm):
        if state["on"]:
            trajs[:] = copy.deepcopy(batch[0])
            stats[:] = copy.deepcopy(batch[1])

    return hook, state
