"""Every Ray RLlib / Tune / Ray private name this library uses, in one place, each with why and the public API that would replace it.

No other module of ``rllib_spear`` touches a private (underscore) name of Ray, RLlib or Tune:
``tests/test_rllib_private_names.py`` greps for them. Each function or adapter class here wraps
private names, says why the library needs them, and names the public API that would replace them,
so that an RLlib upgrade breaks in this one file and the list of what to ask upstream for is
this file's table of contents (docs/design.md, section "RLlib private names we still use").
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, Callable, ClassVar

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core.learner.torch.torch_learner import TorchLearner


# --- Ray: the session this process belongs to
def ray_session_logs_dir() -> Path:
    """The log folder of this process's Ray session (``worker-*.err`` of every actor).

    Private: ``ray._private.worker._global_node.get_logs_dir_path()``. Why: ``rllib-spear train``
    names the first actor error of a failed trial, which only the actor's log holds. Public
    replacement: none (``ray.get_runtime_context()`` has no log folder). Raises when it moved."""
    from ray._private import worker

    return Path(worker._global_node.get_logs_dir_path())


def ray_started_by_this_process() -> bool:
    """Whether this process started the Ray instance it is connected to (``ray.init()`` without
    an address: a head node of its own, which never has an autoscaler).

    Private: ``ray._private.worker._global_node.head``. Why: the resource check refuses a run the
    cluster can never hold unless the cluster can add nodes. Public replacement: none
    (``ray.get_runtime_context()`` does not say who started the node). Raises when it moved."""
    from ray._private import worker

    node = worker._global_node
    return node is not None and bool(node.head)


def autoscaler_v2_enabled() -> bool:
    """Whether the cluster runs autoscaler v2 (its flag in the GCS key-value store).

    Private: ``ray._raylet.GCS_AUTOSCALER_V2_ENABLED_KEY`` / ``GCS_AUTOSCALER_STATE_NAMESPACE``.
    Why: as :func:`ray_started_by_this_process`. Public replacement: none
    (``ray.autoscaler.v2.sdk.get_cluster_status`` needs the GCS address and does not say whether
    nodes can be added). Raises when it moved."""
    import ray
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    flag = internal_kv_get_gcs_client().internal_kv_get(
        ray._raylet.GCS_AUTOSCALER_V2_ENABLED_KEY.encode(),
        namespace=ray._raylet.GCS_AUTOSCALER_STATE_NAMESPACE.encode())
    return flag == b"1"


def autoscaler_v1_status() -> dict[str, Any] | None:
    """Autoscaler v1's last status report (what ``ray status`` prints), None without a monitor.

    Private: ``ray._private.ray_constants.DEBUG_AUTOSCALING_STATUS`` and
    ``ray.experimental.internal_kv._internal_kv_get``. Why: as
    :func:`ray_started_by_this_process` (the report's node types say whether nodes can be
    added). Public replacement: none (``ray status`` is a command line, not an API). Raises when
    it moved."""
    from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
    from ray.experimental.internal_kv import _internal_kv_get

    status = _internal_kv_get(DEBUG_AUTOSCALING_STATUS)
    return None if status is None else json.loads(status)


def ray_deprecation_logger() -> logging.Logger:
    """The logger of Ray's deprecation notices.

    Private: the module name ``ray._common.deprecation``. Why: the model module filters out the
    one notice RLlib's own ``RLModule.__init__`` prints for every module (models/rl_module.py).
    Public replacement: none (RLlib's ``deprecation_warning`` logs there, not through
    ``warnings``)."""
    return logging.getLogger("ray._common.deprecation")


# --- Tune
def tune_env_registry() -> tuple[Any, str]:
    """Tune's process registry and its env category: ``registry.contains(category, name)``,
    ``registry.get(category, name)`` look up an env registered with ``tune.register_env``.

    Private: ``ray.tune.registry._global_registry``. Why: an env name registered with Tune (in
    this process or another of the job) is a valid ``env`` spec (envs/registry.py); RLlib looks
    it up the same way (``Algorithm``'s env creator). Public replacement: a Tune lookup beside
    ``register_env``, as ``registry_get_input`` is beside ``register_input``."""
    from ray.tune.registry import ENV_CREATOR, _global_registry

    return _global_registry, ENV_CREATOR


def restored_run_config(tuner: Any) -> Any | None:
    """The run config a Tuner from ``Tuner.restore`` will run with (its callbacks can be
    replaced in place), or None when Tune's private attribute moved.

    Private: ``Tuner._local_tuner.get_run_config()``. Why: the restored run config holds the
    callbacks pickled at the first start; ``rllib-spear train --resume`` puts this run's progress
    callback in their place. Public replacement: a ``run_config`` (or ``callbacks``) argument of
    ``Tuner.restore``."""
    return getattr(getattr(tuner, "_local_tuner", None), "get_run_config", lambda: None)()


# --- AlgorithmConfig
def config_value_error(config: AlgorithmConfig) -> Callable[[str], None]:
    """The function every ``validate()`` check of ``config`` reports a bad setting with.

    Private: ``AlgorithmConfig._value_error``. Why: RLlib's own checks raise through it, so our
    errors carry the same suffix and respect ``.experimental(_validate_config=False)`` (a
    warning instead of the error). Public replacement: none (RLlib's checks call it directly)."""
    return config._value_error


def user_model_config(config: AlgorithmConfig) -> dict[str, Any]:
    """The ``model_config`` the user set (``.rl_module(model_config=...)``), without the keys
    the algorithm adds (``config.model_config`` is both merged).

    Private: ``AlgorithmConfig._model_config``. Why: ``GRPO.setup`` replaces the model path of
    a frozen config with its resolved folder and must copy only what the user set (the added
    keys follow the config's own settings, e.g. an evaluation config's ``temperature``). Public
    replacement: a getter of the user's part (``get_state()`` holds it under its private key)."""
    model_config = config._model_config
    return dict(model_config) if isinstance(model_config, dict) else dataclasses.asdict(model_config)


class AlgorithmConfigAdapter(AlgorithmConfig):
    """RLlib's ``AlgorithmConfig`` with the private hook our configs fill, as a public class
    attribute."""

    #: Config attributes RLlib copies into ``model_config`` (what every RLModule is built with);
    #: a key of the user's ``model_config`` wins.
    MODEL_CONFIG_AUTO_INCLUDES: ClassVar[tuple[str, ...]] = ()

    @property
    def _model_config_auto_includes(self) -> dict[str, Any]:
        """Private: ``AlgorithmConfig._model_config_auto_includes``. Why: RLlib merges it into
        ``model_config``; RLlib's own configs (PPO, SAC, DQN) override it the same way. Public
        replacement: none."""
        return {name: getattr(self, name) for name in self.MODEL_CONFIG_AUTO_INCLUDES}


# --- Algorithm
class AlgorithmAdapter(Algorithm):
    """RLlib's ``Algorithm`` with the private hook our algorithms turn off."""

    def _create_local_replay_buffer_if_necessary(self, config: AlgorithmConfig) -> None:
        """None: the recipe builds the replay buffer (SIL's, ``recipe/sil_spec.py``), and the
        algorithm holds it as ``local_replay_buffer``.

        Private: ``Algorithm._create_local_replay_buffer_if_necessary``. Why: ``Algorithm.setup``
        would build ``replay_buffer_config`` itself, before the recipe exists, resolving the
        buffer's ``type`` name in RLlib's modules only. Public replacement: a
        ``replay_buffer_config`` RLlib leaves alone; its ``no_local_replay_buffer`` key does
        that, but the dict is the user's SIL buffer config and every key of it reaches the
        buffer's constructor."""
        return None


# --- TorchLearner overrides (the learner's private hooks)
class TorchLearnerPrivateHooks(TorchLearner):
    """RLlib's ``TorchLearner`` with the four private methods the GRPO learner must replace, each
    handed to a public-named method (``rllib_spear.learner.rllib_learner.GRPOTorchLearner``
    overrides those; their defaults here are RLlib's own behaviour), and the one private
    attribute it sets (:meth:`set_weights_seq_no`). A base class, not a mixin: the learner's
    only base."""

    # Private: ``TorchLearner._uncompiled_update``. Why: RLlib's step runs one ``forward_train``
    # over the whole batch and one optimizer step; the learner needs token-budget micro-batches
    # with accumulated gradients, ``no_sync``, dummy rows for lockstep and several optimizer
    # steps per call (``rllib_spear.learner.core``), and no public hook runs per micro-batch
    # (``Learner.update(minibatch_size=...)`` cuts rows without the groups and their global
    # normalizers). RLlib's own TorchDifferentiableLearner / TorchMetaLearner override it too;
    # ``_update``'s torch.compile dispatch stays RLlib's. Public replacement: a supported
    # "update step" hook of ``TorchLearner``.
    def _uncompiled_update(self, batch: dict, **kwargs: Any):
        return self.run_update(batch)

    def run_update(self, batch: dict) -> tuple:
        """One update on ``batch`` ({module id: tensors}): (forward outputs, {module id: loss},
        tensor metrics), as RLlib's ``_uncompiled_update`` returns them."""
        return TorchLearner._uncompiled_update(self, batch)

    # Private: ``Learner._make_module`` (its docstring invites overrides). Why: non-zero FSDP
    # ranks build the module under ``empty_weights()``, and activation checkpointing, the
    # reference-model copy and FSDP sharding must run after the module exists and before
    # ``configure_optimizers`` (AdamW must hold the shards); ``build()`` runs both in one call,
    # so it has no point in between. Public replacement: a hook between module construction and
    # optimizer construction in ``Learner.build``.
    def _make_module(self):
        return self.make_module()

    def make_module(self):
        """The learner's MultiRLModule (RLlib: built from the module spec, then moved to the
        device by :meth:`move_module_to_device`)."""
        return TorchLearner._make_module(self)

    # Private: ``TorchLearner._map_module_to_device``. Why: under FSDP the whole model must not be
    # moved to the device first (each rank's shards are placed as they are cut); no setting turns
    # the move off. Public replacement: a config switch for the move.
    def _map_module_to_device(self, module) -> None:
        self.move_module_to_device(module)

    def move_module_to_device(self, module) -> None:
        """Move ``module`` to the learner's device (RLlib's default)."""
        TorchLearner._map_module_to_device(self, module)

    # Private: ``TorchLearner._make_modules_ddp_if_necessary`` (marked
    # ``OverrideToImplementCustomLogic``). Why: under FSDP the module must not be wrapped in DDP,
    # and RLlib wraps whenever ``num_learners > 1``. Public replacement: a config switch (or a
    # public wrapping hook) for the DDP wrap.
    def _make_modules_ddp_if_necessary(self) -> None:
        self.wrap_module_for_ddp()

    def wrap_module_for_ddp(self) -> None:
        """Wrap the module in DDP when ``num_learners > 1`` (RLlib's default)."""
        TorchLearner._make_modules_ddp_if_necessary(self)

    # Private: ``Learner._weights_seq_no``. Why: a restored learner state sets the weights version
    # it holds, older or not, and RLlib's ``Learner.set_state`` only ever raises it (and never to
    # 0), so the weight sync would not send the restored weights (docs/design.md "Restoring an
    # older checkpoint"). Public replacement: ``set_state`` that takes the state's
    # ``WEIGHTS_SEQ_NO`` as it is.
    def set_weights_seq_no(self, seq_no: int) -> None:
        """Set the version of the weights this learner holds (``WEIGHTS_SEQ_NO``)."""
        self._weights_seq_no = int(seq_no)


def learner_actor_ids(learner_group: Any) -> list:
    """The actor ids of a ``LearnerGroup``'s remote learners, by rank (the order RLlib made them).

    Private: ``LearnerGroup._worker_manager.actor_ids()``. Why: ``learner.failure`` names the
    learner ranks that died during an update, and ``foreach_learner`` results carry actor ids
    only. Public replacement: the learners' ranks on ``foreach_learner`` results (or a public
    ``LearnerGroup`` accessor of the actor ids)."""
    return list(learner_group._worker_manager.actor_ids())
