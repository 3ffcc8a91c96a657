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
