"""What a weight-sync transport is: one registered class with a side in each process a sync
crosses (docs/design.md "Weight streaming").

* **driver**: an instance of the :class:`Transport` subclass, held by the driver's
  :class:`~rllib_spear.weight_streaming.sync.WeightSync`. It says whether it can run for the
  placement of the learners and runners (:meth:`Transport.unavailable`), runs one sync
  (:meth:`Transport.sync`), and keeps what it formed between syncs (a group, a cached answer).
* **learner**: its :attr:`Transport.sender`, a :class:`WeightSender` built from the learner's
  inference weights (``learner_side.LearnerWeights``). Every learner rank holds one per
  transport it has sent through (``learner.weight_senders``); rank 0 sends, the others take
  part in the gathers under FSDP.
* **runner**: its :attr:`Transport.receiver`, a :class:`WeightReceiver` built from the runner's
  engine and weights version (``runner_side.EngineWeights``), held by the runner
  (``runner.weight_receivers``).

The driver reaches the other two sides through a :class:`Placement`: a function run on every
learner's sender, or every runner's receiver, of one transport. The transport's class travels
with those calls (cloudpickle: by reference where the workers can import its module, else by
value once the module is registered with ``ray.cloudpickle.register_pickle_by_value``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from .selection import GLOO_BACKEND

if TYPE_CHECKING:
    from .learner_side import LearnerWeights
    from .runner_side import EngineWeights

__all__ = ["Transport", "WeightSender", "WeightReceiver", "SyncSettings", "Placement"]

#: Tag of the weight sync's async runner calls (kept apart from any sampling requests).
_ASYNC_TAG = "rllib_spear_weight_sync"


class WeightSender:
    """A learner's side of one transport, built from the learner's inference weights (every
    learner rank builds one; subclasses add the calls their transport's driver side makes)."""

    def __init__(self, weights: "LearnerWeights") -> None:
        self.weights = weights

    def sent_bytes(self) -> int | None:
        """Bytes this rank put on the wire for its last sync; None when it sent nothing itself
        (a rank other than 0) or does not count them."""
        return None


class WeightReceiver:
    """A runner's side of one transport, built from the runner's engine and weights version.
    A receiver that changes the engine's weights opens ``weights.updating()`` for that time and
    sets ``weights.version`` only once every tensor of the new version is in the engine."""

    def __init__(self, weights: "EngineWeights") -> None:
        self.weights = weights

    def close(self) -> None:
        """Release what it holds (the runner stops)."""


@dataclass(frozen=True)
class SyncSettings:
    """The knobs every transport may read (``learners(...)``): ``bucket_bytes`` (the size bound of
    one bucket), ``sharding`` (the learners' layout) and ``transfer_backend`` (transport "vllm")."""

    bucket_bytes: int = 256 * 2**20
    sharding: str = "ddp"
    transfer_backend: str = GLOO_BACKEND


class Transport:
    """One way the learners' weights reach the runners' engines. Subclass it, set ``sender`` and
    ``receiver``, implement :meth:`sync` (and :meth:`unavailable` when it cannot run everywhere),
    and register it with ``register_transport(name)``; :func:`rllib_spear.testing.check_transport_contract`
    checks it. An instance lives on the driver, one per algorithm, and holds this transport's
    state between syncs."""

    #: the registered name (set by ``register_transport``)
    name: ClassVar[str] = ""
    #: the learner's side and the runner's side
    sender: ClassVar[type[WeightSender]] = WeightSender
    receiver: ClassVar[type[WeightReceiver]] = WeightReceiver
    #: the transport that carries a sync this one fails (None: its failure fails the sync)
    fallback: ClassVar[str | None] = None
    #: named in the config, a strict transport that cannot run here, or could not set itself up
    #: (:attr:`ready` was False), fails the sync; a lenient one hands it to ``fallback`` (with a
    #: warning): the default transport of vLLM engines is lenient
    strict: ClassVar[bool] = True
    #: the dtype its bytes travel in: "engine" (wider floating tensors cast on the sender) or
    #: "learner" (the learner's own tensors: nothing is copied, or the engine casts)
    wire_dtype: ClassVar[str] = "engine"
    #: the engine it needs (``env_runners(engine=...)``; None: any)
    requires_engine: ClassVar[str | None] = None

    def __init__(self, settings: SyncSettings) -> None:
        self.settings = settings

    @property
    def ready(self) -> bool:
        """Whether it holds what an earlier sync set up (a formed group): a sync that fails while
        not ready failed to set the transport up."""
        return True

    def unavailable(self, placement: "Placement") -> str:
        """Why it cannot run for this placement of learners and runners ("" when it can)."""
        return ""

    def sync(self, placement: "Placement") -> tuple[list[int], int]:
        """Send the learners' current weights to every runner: (the version each runner reports,
        the version sent). The caller checks that they agree."""
        raise NotImplementedError(f"{type(self).__name__}.sync")


def _raise_first_error(results: Any) -> list:
    """The values of a ``foreach_learner``'s results, raising the first error."""
    errors = [r.get() for r in results.result_or_errors if not r.ok]
    if errors:
        raise errors[0]
    return [r.get() for r in results.result_or_errors]


class Placement:
    """Where the learners and runners of one sync are, as the driver reaches them: a function on
    every learner's or runner's side of a transport, and what every transport asks (the engines'
    weight dtype, asked once). ``learner_group`` / ``env_runner_group``: RLlib's groups (without
    remote runners, the driver's local runner is the one runner)."""

    def __init__(self, learner_group: Any, env_runner_group: Any) -> None:
        self.learner_group = learner_group
        self.env_runner_group = env_runner_group
        self._engine_dtype: str | None = None

    # ------------------------------------------------------------------ placement
    @property
    def local_runner_only(self) -> bool:
        """No remote runner: the driver's local runner samples."""
        return self.env_runner_group.num_remote_env_runners() == 0

    def healthy_remote_runners(self) -> int:
        return self.env_runner_group.num_healthy_remote_env_runners()

    def runner_ids(self) -> tuple:
        """The healthy runners' ids (a restarted runner keeps its id)."""
        if self.local_runner_only:
            return ("local",)
        return tuple(self.env_runner_group.healthy_env_runner_ids())

    # ------------------------------------------------------------------ learners
    def on_senders(self, transport: type[Transport], fn: Callable[[WeightSender], Any]) -> Any:
        """``fn(sender)`` on every learner rank; rank 0's result (the one that is not None)."""
        answers = [v for v in self.on_every_sender(transport, fn) if v is not None]
        if not answers:
            raise RuntimeError(f"weight sync ({transport.name}): no learner rank answered")
        return answers[0]

    def on_every_sender(self, transport: type[Transport], fn: Callable[[WeightSender], Any], *,
                        raise_errors: bool = True) -> list:
        """``fn(sender)`` on every learner rank, by rank (the first error raised)."""
        results = self.learner_group.foreach_learner(lambda learner, t=transport: fn(learner.weight_senders.of(t)))
        return _raise_first_error(results) if raise_errors else []

    # ------------------------------------------------------------------ runners
    def on_runners(self, fn: Callable[[Any], Any], *, remote_only: bool = False) -> list:
        """``fn(runner)`` on every healthy runner (the driver's local one when there is no remote
        runner, unless ``remote_only``)."""
        if self.local_runner_only and not remote_only:
            return [fn(self.env_runner_group.local_env_runner)]
        return self.env_runner_group.foreach_env_runner(fn, local_env_runner=False)

    def on_receivers(self, transport: type[Transport], fn: Callable[[WeightReceiver], Any], *,
                     remote_only: bool = False) -> list:
        """``fn(receiver)`` on every healthy runner (see :meth:`on_runners`)."""
        return self.on_runners(lambda runner, t=transport: fn(runner.weight_receivers.of(t)), remote_only=remote_only)

    def on_receivers_while(self, transport: type[Transport], fn: Callable[[WeightReceiver], Any],
                           then: Callable[[], Any]) -> list:
        """``fn(receiver)`` on every healthy remote runner without waiting, then ``then()`` here
        (the sender's side, which needs the receivers at the same time), then the runners'
        results."""
        group = self.env_runner_group
        n = group.foreach_env_runner_async(lambda runner, t=transport: fn(runner.weight_receivers.of(t)),
                                           tag=_ASYNC_TAG)
        try:
            then()
        finally:
            results = group.fetch_ready_async_reqs(tags=_ASYNC_TAG, timeout_seconds=None) if n else []
        return [r for _, r in results]

    def engine_dtype(self) -> str | None:
        """The weight dtype every runner's engine holds (e.g. "bfloat16"), or None when they
        differ or one cannot say (the learner then sends its own dtypes). Asked once: a
        restarted runner builds its engine from the same config."""
        if self._engine_dtype is None:
            dtypes = set(self.on_runners(lambda runner: runner.weight_receivers.weights.dtype()))
            if len(dtypes) != 1 or None in dtypes:
                return None
            self._engine_dtype = dtypes.pop()
        return self._engine_dtype
