"""Weight sync from the learners to the runners' engines, in one home (docs/design.md "Weight
streaming").

* **Transports** are registered pieces (``registry``: :func:`register_transport`, ``"auto"``'s
  ordered list :data:`AUTO`): each is a :class:`Transport` subclass with a side in every process
  a sync crosses (``transport``): the driver's instance, the learner's :class:`WeightSender` and
  the runner's :class:`WeightReceiver`. The built-ins live in ``transports/``: ``object_store``,
  ``shared_memory``, ``collective``, ``vllm`` and ``driver``.
* **The driver** runs the configured transport with its fallbacks and checks every runner's
  version (``sync``: :class:`WeightSync`, which the algorithm holds).
* **The learner** holds its senders (``learner_side``: ``learner.weight_senders``, over its
  inference weights :class:`LearnerWeights`); **the runner** its receivers (``runner_side``:
  ``runner.weight_receivers``, over its engine and version :class:`EngineWeights`).
* **The wire**: ``buckets`` groups (and packs) the tensors in buckets of bounded size,
  ``staging`` packs a bucket into one host buffer that every bucket reuses (packed on the
  device, one copy to pinned memory) for the transports that send host bytes, ``object_store``
  ships them as one Ray object per bucket, ``collective`` broadcasts them over a gloo group,
  ``shared_memory`` lets runners on the sender's node read its weights in place, ``receiver``
  applies streamed and broadcast buckets on an engine, ``vllm_transfer`` (imported on use: it
  needs vLLM) plugs the learner into vLLM's own weight-transfer API, and ``selection`` resolves
  the config's transport and backend.

Nothing here imports Ray or vLLM at import time (the GPU learner check imports ``buckets``
without them).
"""
from .buckets import Bucket, BucketMeta, TensorSpec, iter_buckets, pack_bucket, unpack_bucket
from .learner_side import LearnerWeights, WeightSenders, wire_dtype_of
from .object_store import WeightManifest, iter_bucket_tensors, put_bucket
from .receiver import BucketStream
from .registry import AUTO, TRANSPORTS, get_transport, register_transport, transport_names
from .runner_side import EngineWeights, WeightReceivers
from .selection import GLOO_BACKEND, TRANSFER_BACKENDS, resolve_transfer_backend, resolve_transport
from .staging import HostStaging
from .sync import WeightSync, check_versions
from .transport import Placement, SyncSettings, Transport, WeightReceiver, WeightSender

__all__ = ["Bucket", "BucketMeta", "TensorSpec", "iter_buckets", "pack_bucket", "unpack_bucket",
           "HostStaging", "WeightManifest", "put_bucket", "iter_bucket_tensors", "BucketStream",
           "TRANSPORTS", "AUTO", "register_transport", "get_transport", "transport_names",
           "Transport", "WeightSender", "WeightReceiver", "SyncSettings", "Placement",
           "WeightSync", "check_versions", "LearnerWeights", "WeightSenders", "wire_dtype_of",
           "EngineWeights", "WeightReceivers",
           "GLOO_BACKEND", "TRANSFER_BACKENDS", "resolve_transport", "resolve_transfer_backend"]
