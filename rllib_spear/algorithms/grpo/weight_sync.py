"""Learner -> env-runner weight sync with a version check (docs/design.md, "One training
iteration", "Weight streaming")."""
from __future__ import annotations

import logging
import uuid
import weakref
from typing import Any, Iterator

__all__ = ["sync_weights", "object_store_sync", "shared_memory_sync", "stream_learner_buckets", "send_bucket",
           "release_learner_buckets", "check_versions", "collective_sync", "vllm_transfer_sync"]

logger = logging.getLogger(__name__)

#: Tag of this module's async runner calls (kept apart from any sampling requests).
_TAG = "rllib_spear_weight_sync"
#: env-runner group -> {"group_id", "size"} of its weight group; "auto" groups that could not be
#: formed map to {"group_id": None} (the object store is used from then on).
_GROUPS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
#: env-runner group -> {"group_id", "size"} of its vLLM transfer group (transport "vllm").
_TRANSFER_GROUPS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
#: env-runner groups whose "vllm" transport fell back to the object store (said once).
_FELL_BACK: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
#: env-runner group -> the weight dtype its engines hold (asked once; a restarted runner builds
#: its engine from the same config).
_ENGINE_DTYPES: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
#: env-runner group -> {"runners", "why"}: whether "shared_memory" can run, for these runners.
_SHARED_POSSIBLE: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _learner_weights(learner_group: Any, sharding: str) -> dict[str, Any]:
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    if sharding == "fsdp":
        # Every rank gathers its shards one tensor at a time; rank 0 returns the weights.
        return _rank0_result(learner_group.foreach_learner(lambda learner: learner.engine_state()))
    return learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE,
                                   inference_only=True)[COMPONENT_LEARNER]


def _rank0_result(results: Any) -> Any:
    """The one non-None result of a ``foreach_learner`` (rank 0's), raising the first error."""
    errors = [r.get() for r in results.result_or_errors if not r.ok]
    if errors:
        raise errors[0]
    return next(s for s in (r.get() for r in results.result_or_errors) if s is not None)


def check_versions(versions: list[int], expected: int) -> int:
    """``expected`` when every runner reports it; else a RuntimeError naming the versions."""
    if any(v != expected for v in versions):
        raise RuntimeError(f"weight sync: runners report versions {versions}, expected {expected}")
    return expected


def _foreach_runner(env_runner_group: Any, fn) -> list:
    if env_runner_group.num_remote_env_runners() == 0:
        return [fn(env_runner_group.local_env_runner)]
    return env_runner_group.foreach_env_runner(fn, local_env_runner=False)


def stream_learner_buckets(learner_group: Any, bucket_bytes: int,
                           engine_dtype: str | None = None) -> Iterator[tuple[int, Any, Any, bool]]:
    """Learner rank 0 puts the weights into the object store one bucket per call (every rank
    takes part under FSDP); yields ``(version, meta, ref, last)`` for each bucket as soon as it
    is in the store (refs and metadata: the driver never holds a tensor). The learner keeps the
    refs until ``release_learner_buckets``. ``engine_dtype``: the engines' weight dtype (wider
    floating tensors are cast to it on the learner)."""
    start = True
    while True:
        version, meta, ref, last = _rank0_result(learner_group.foreach_learner(
            lambda learner, s=start: learner.put_next_engine_bucket(bucket_bytes, start=s, engine_dtype=engine_dtype)))
        start = False
        yield version, meta, ref, last
        if last:
            return


def release_learner_buckets(learner_group: Any) -> None:
    """The learner drops the refs of its last stream (the objects go once the runners are done)."""
    learner_group.foreach_learner(lambda learner: learner.release_engine_weights())


def send_bucket(env_runner_group: Any, version: int, meta: Any, ref: Any, last: bool) -> list:
    """Hand one bucket's (metadata, ref) to every runner. A runner applies it in the background
    while the learner puts the next one; the call with ``last`` waits until the runner applied
    them all and returns its versions (the new one only if every bucket arrived)."""
    return _foreach_runner(env_runner_group, lambda runner, v=version, m=meta, r=ref, e=last:
                           runner.receive_weight_bucket(v, m, r, e))


def engines_weight_dtype(env_runner_group: Any) -> str | None:
    """The weight dtype every runner's engine holds (e.g. "bfloat16"), or None when they differ
    or one cannot say (the learner then sends its own dtypes). Asked once per runner group."""
    known = _ENGINE_DTYPES.get(env_runner_group)
    if known is not None:
        return known
    dtypes = set(_foreach_runner(env_runner_group, lambda runner: runner.engine_weight_dtype()))
    if len(dtypes) != 1 or None in dtypes:
        return None
    _ENGINE_DTYPES[env_runner_group] = dtype = dtypes.pop()
    return dtype


def object_store_sync(learner_group: Any, env_runner_group: Any, bucket_bytes: int) -> tuple[list[int], int]:
    """Transport "object_store", pipelined: the learner puts bucket k+1 while every runner
    applies bucket k, each bucket in the engines' weight dtype (fp32 master weights reach bf16
    engines as half the bytes); returns (the runners' versions, the sent version)."""
    versions, version = [], None
    wire = engines_weight_dtype(env_runner_group)
    try:
        for version, meta, ref, last in stream_learner_buckets(learner_group, bucket_bytes, wire):
            versions = send_bucket(env_runner_group, version, meta, ref, last)
    finally:
        release_learner_buckets(learner_group)
    return versions, version


def _sync_via_driver(learner_group: Any, env_runner_group: Any, sharding: str) -> int:
    import ray
    from ray.rllib.core import COMPONENT_RL_MODULE
    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

    state = _learner_weights(learner_group, sharding)
    payload = {COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE], WEIGHTS_SEQ_NO: int(state.get(WEIGHTS_SEQ_NO, 0))}
    expected = payload[WEIGHTS_SEQ_NO]
    if env_runner_group.num_remote_env_runners() == 0:
        env_runner_group.local_env_runner.set_state(payload)
        versions = [env_runner_group.local_env_runner.weights_version]
    else:
        ref = ray.put(payload)

        def apply(runner, ref=ref):
            runner.set_state(ray.get(ref))
            return runner.weights_version

        versions = env_runner_group.foreach_env_runner(apply, local_env_runner=False)
    return check_versions(versions, expected)


def _run_async_on_runners(env_runner_group: Any, fn, then) -> list:
    """``fn`` on every healthy remote runner, without waiting; then ``then()`` here (the
    sender's side, which needs the runners at the same time); then the runners' results."""
    n = env_runner_group.foreach_env_runner_async(fn, tag=_TAG)
    try:
        then()
    finally:
        results = env_runner_group.fetch_ready_async_reqs(tags=_TAG, timeout_seconds=None) if n else []
    return [r for _, r in results]


def _form_group(learner_group: Any, env_runner_group: Any) -> dict:
    """A new weight group of learner rank 0 and every healthy remote runner."""
    n = env_runner_group.num_healthy_remote_env_runners()
    group_id = f"weights-{uuid.uuid4().hex[:12]}"
    host, port = _rank0_result(learner_group.foreach_learner(
        lambda learner: learner.open_weight_group(group_id, n + 1)))

    def join_sender():
        results = learner_group.foreach_learner(lambda learner: learner.join_weight_group())
        errors = [r.get() for r in results.result_or_errors if not r.ok]
        if errors:
            raise errors[0]

    ranks = _run_async_on_runners(
        env_runner_group, lambda runner: runner.join_weight_group(group_id, host, port, n + 1), join_sender)
    if sorted(ranks) != list(range(1, n + 1)):
        raise RuntimeError(f"weight group {group_id}: runner ranks {ranks}, expected 1..{n}")
    logger.info("weight group %s formed: learner rank 0 and %d runners on %s:%d", group_id, n, host, port)
    return {"group_id": group_id, "size": n}


def collective_sync(learner_group: Any, env_runner_group: Any, bucket_bytes: int) -> tuple[list[int], int]:
    """Transport "collective": (re-)form the weight group when its runners changed (a runner
    restarted after a failure is in no group), then learner rank 0 broadcasts the buckets (in
    the engines' weight dtype) while every runner receives and applies them; returns (the
    runners' versions, the sent version)."""
    ids = env_runner_group.foreach_env_runner(lambda runner: runner.weight_group_id(), local_env_runner=False)
    state = _GROUPS.get(env_runner_group)
    if state is None or state["group_id"] is None or ids != [state["group_id"]] * len(ids) \
            or len(ids) != state["size"]:
        _GROUPS.pop(env_runner_group, None)
        state = _GROUPS[env_runner_group] = _form_group(learner_group, env_runner_group)
    wire = engines_weight_dtype(env_runner_group)
    try:
        sent: list = []
        versions = _run_async_on_runners(
            env_runner_group, lambda runner: runner.receive_weight_broadcast(),
            lambda: sent.append(_rank0_result(learner_group.foreach_learner(
                lambda learner: learner.broadcast_engine_weights(bucket_bytes, engine_dtype=wire)))))
    except Exception:
        _GROUPS.pop(env_runner_group, None)  # re-form on the next sync
        raise
    if len(versions) != state["size"]:  # a member failed meanwhile: re-form the group next time
        _GROUPS.pop(env_runner_group, None)
        raise RuntimeError(f"weight group {state['group_id']}: {len(versions)} of {state['size']} runners answered")
    return versions, int(sent[0][0])


def _form_transfer_group(learner_group: Any, env_runner_group: Any, backend: str, bucket_bytes: int) -> dict:
    """A new vLLM transfer group of the learners (rank 0 sends) and every healthy runner's
    engine: each runner says how to reach it, its engine's worker count and weight dtype; every
    learner rank builds vLLM's trainer engine (rank 0 rendezvouses with the engines)."""
    endpoints = _foreach_runner(env_runner_group, lambda runner: runner.weight_transfer_endpoint())
    if not endpoints:
        raise RuntimeError("weight sync: no healthy runner answered")
    dtypes = {e["dtype"] for e in endpoints}
    if len(dtypes) != 1:
        raise RuntimeError(f"weight sync: the runners' engines hold different dtypes {sorted(dtypes)}")
    group_id = f"transfer-{uuid.uuid4().hex[:12]}"
    targets = [e["target"] for e in endpoints]
    sizes = [e["world_size"] for e in endpoints]
    wire = dtypes.pop()
    results = learner_group.foreach_learner(
        lambda learner, g=group_id, t=targets, s=sizes: learner.vllm_transfer_init(
            g, backend, t, s, bucket_bytes, wire))
    errors = [r.get() for r in results.result_or_errors if not r.ok]
    if errors:
        raise errors[0]
    logger.info("vLLM transfer group %s (%s) formed: learner rank 0 and %d runners (%d engine workers), %s on the "
                "wire", group_id, backend, len(targets), sum(sizes), wire)
    return {"group_id": group_id, "size": len(targets)}


def _transfer_unreachable(learner_group: Any, env_runner_group: Any) -> str:
    """Why learner rank 0 cannot call the runners ("" when it can): the driver's local runner
    has no actor handle, so it is reachable only from a learner in the driver's process."""
    if env_runner_group.num_remote_env_runners() == 0 and not learner_group.is_local:
        return "the runner is the driver's local one and the learners are remote actors"
    if env_runner_group.num_remote_env_runners() > 0 and env_runner_group.num_healthy_remote_env_runners() == 0:
        return "no healthy remote runner"
    return ""


def vllm_transfer_sync(learner_group: Any, env_runner_group: Any, backend: str,
                       bucket_bytes: int) -> tuple[list[int], int]:
    """Transport "vllm": (re-)form the transfer group when its runners changed (a restarted
    runner is in none), then one sync through vLLM's weight-transfer API; returns (the runners'
    versions, the sent version). A runner whose update did not finish keeps its old version."""
    ids = _foreach_runner(env_runner_group, lambda runner: runner.weight_transfer_group_id())
    state = _TRANSFER_GROUPS.get(env_runner_group)
    if state is None or ids != [state["group_id"]] * len(ids) or len(ids) != state["size"]:
        _TRANSFER_GROUPS.pop(env_runner_group, None)
        state = _TRANSFER_GROUPS[env_runner_group] = _form_transfer_group(
            learner_group, env_runner_group, backend, bucket_bytes)
    try:
        sent = _rank0_result(learner_group.foreach_learner(lambda learner: learner.vllm_transfer_send()))
    except Exception:
        _TRANSFER_GROUPS.pop(env_runner_group, None)  # re-form on the next sync
        raise
    versions = _foreach_runner(env_runner_group, lambda runner: runner.weights_version)
    return versions, int(sent)


def _collective_possible(learner_group: Any, env_runner_group: Any) -> str:
    """Why the collective transport cannot run here ("" when it can)."""
    if env_runner_group.num_remote_env_runners() == 0:
        return "the runner is the driver's local runner"
    if env_runner_group.num_healthy_remote_env_runners() == 0:
        return "no healthy remote runner"
    return ""


def shared_memory_sync(learner_group: Any, env_runner_group: Any) -> tuple[list[int], int]:
    """Transport "shared_memory": learner rank 0 keeps its weights in shared memory and sends
    only their handle; every runner (on its node) loads them straight from there; returns (the
    runners' versions, the sent version). Blocks keep their names only until every runner has
    mapped them; a runner that has not (it restarted since) answers None, and the learner then
    shares new blocks, which every runner maps."""
    def share(refresh: bool):
        return _rank0_result(learner_group.foreach_learner(
            lambda learner, r=refresh: learner.share_engine_weights(refresh=r)))

    def read(handle) -> list:
        return _foreach_runner(env_runner_group, lambda runner, h=handle: runner.read_shared_weights(h))

    handle = share(False)
    try:
        versions = read(handle)
        if any(v is None for v in versions):
            if handle.linked:
                raise RuntimeError("weight sync: a runner could not map the learner's shared weights")
            handle = share(True)
            versions = read(handle)
    finally:
        if handle.linked:
            learner_group.foreach_learner(lambda learner: learner.unlink_engine_weights())
    return versions, handle.version


def _runner_ids(env_runner_group: Any) -> tuple:
    if env_runner_group.num_remote_env_runners() == 0:
        return ("local",)
    return tuple(env_runner_group.healthy_env_runner_ids())


def _shared_memory_possible(learner_group: Any, env_runner_group: Any) -> str:
    """Why the shared-memory transport cannot run here ("" when it can): the learner's weights
    must be shareable and every runner on learner rank 0's node. Asked again when the healthy
    runners change (a restarted runner may be placed on another node)."""
    ids = _runner_ids(env_runner_group)
    cached = _SHARED_POSSIBLE.get(env_runner_group)
    if cached is not None and cached["runners"] == ids:
        return cached["why"]

    def learner_side(learner):
        import ray

        from .learner_setup import rank

        if rank() != 0:
            return None
        return learner.shared_weights_unsupported(), ray.get_runtime_context().get_node_id()

    why, node = _rank0_result(learner_group.foreach_learner(learner_side))
    if not why:
        nodes = _foreach_runner(env_runner_group, lambda runner: runner.node_id())
        if any(n != node for n in nodes):
            why = "some runners are on another node than learner rank 0"
    _SHARED_POSSIBLE[env_runner_group] = {"runners": ids, "why": why}
    return why


def sync_weights(learner_group: Any, env_runner_group: Any, sharding: str, *,
                 transport: str = "object_store", bucket_mb: float = 256,
                 transfer_backend: str = "rllib_spear_gloo") -> int:
    """Push the learners' weights to every runner, check each runner's version, return it.

    RLlib's ``sync_weights`` is fire-and-forget with a cap on requests in flight, so a sync can
    be silently dropped; here each runner applies the weights (torch tensors, never RLlib's
    float32-numpy conversion) synchronously and returns its WEIGHTS_SEQ_NO. A runner that
    reports another version (e.g. it missed a bucket) fails the step loudly.

    ``transport`` (docs/design.md "Weight streaming"): "object_store" (learner rank 0 puts one
    Ray object per bucket of at most ``bucket_mb`` MB; runners fetch and apply them one at a
    time, bucket k while the learner puts bucket k+1), "shared_memory" (runners on the
    learner's node read its weights straight from shared memory), "collective" (learner rank 0
    broadcasts the buckets over a gloo group of itself and the runners), "auto" (shared memory
    when it can run, else the collective when its group can be formed, else the object store)
    or "driver" (the whole state through the driver, one object for all runners: the old path),
    or "vllm" (vLLM's own weight-transfer API with ``transfer_backend``: learner rank 0 drives
    the engines' start / update / finish and sends in the engines' dtype; where the learner
    cannot reach the runners, the object store, said once).
    """
    from ...weight_streaming import TRANSPORTS

    if transport not in TRANSPORTS:
        raise ValueError(f"weight_sync_transport must be one of {TRANSPORTS}, got {transport!r}")
    if transport == "driver":
        return _sync_via_driver(learner_group, env_runner_group, sharding)
    if transport in ("shared_memory", "auto"):
        why = _shared_memory_possible(learner_group, env_runner_group)
        if not why:
            return check_versions(*shared_memory_sync(learner_group, env_runner_group))
        if transport == "shared_memory":
            raise ValueError(f"weight_sync_transport='shared_memory' cannot run: {why}; use 'auto' or 'object_store'")
    bucket_bytes = max(1, int(bucket_mb * 2**20))
    if transport == "vllm":
        why = _transfer_unreachable(learner_group, env_runner_group)
        if not why:
            try:
                return check_versions(*vllm_transfer_sync(learner_group, env_runner_group, transfer_backend,
                                                          bucket_bytes))
            except Exception as e:
                # e.g. a runner died mid-update: this sync goes through the object store (every
                # runner's version is still checked), the next one re-forms the group
                logger.warning("weight sync: the vLLM transfer group failed (%s: %s); this sync uses the "
                               "object store", type(e).__name__, e)
        elif env_runner_group not in _FELL_BACK:
            _FELL_BACK[env_runner_group] = True
            logger.warning("weight_sync_transport='vllm' cannot run here (%s); using the object store", why)
    if transport in ("collective", "auto"):
        why = _collective_possible(learner_group, env_runner_group)
        if why and transport == "collective":
            raise ValueError(f"weight_sync_transport='collective' cannot run: {why}; use 'object_store' or 'auto'")
        state = _GROUPS.get(env_runner_group)
        if not why and not (transport == "auto" and state is not None and state["group_id"] is None):
            try:
                versions, expected = collective_sync(learner_group, env_runner_group, bucket_bytes)
            except Exception as e:
                if state is None and transport == "auto":
                    logger.warning("weight_sync_transport='auto': the collective group could not be formed "
                                   "(%s: %s); using the object store from now on", type(e).__name__, e)
                    _GROUPS[env_runner_group] = {"group_id": None, "size": 0}
                elif state is None:
                    raise
                else:  # a formed group broke (e.g. a runner died): this sync goes through the object
                    # store; the next one re-forms the group with the healthy runners
                    logger.warning("weight sync: the collective group failed (%s: %s); this sync uses the "
                                   "object store", type(e).__name__, e)
            else:
                return check_versions(versions, expected)
    versions, expected = object_store_sync(learner_group, env_runner_group, bucket_bytes)
    return check_versions(versions, expected)
