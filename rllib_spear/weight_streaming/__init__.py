"""Streaming weight sync from the learner to the engines, in buckets of bounded size
(docs/design.md "Weight streaming"): ``buckets`` groups (and, for a collective, packs) them,
``object_store`` ships them as one Ray object per bucket, ``collective`` broadcasts them over a
gloo group of the sender and the runners, ``shared_memory`` lets runners on the sender's node
read its weights in place, ``receiver`` applies them on a runner's engine, ``vllm_transfer``
(imported on use: it needs vLLM) plugs the learner into vLLM's own weight-transfer API."""
from .buckets import Bucket, BucketMeta, TensorSpec, iter_buckets, pack_bucket, unpack_bucket
from .object_store import WeightManifest, iter_bucket_tensors, put_bucket
from .receiver import BucketStream
from .selection import GLOO_BACKEND, TRANSFER_BACKENDS, resolve_transfer_backend, resolve_transport

__all__ = ["Bucket", "BucketMeta", "TensorSpec", "iter_buckets", "pack_bucket", "unpack_bucket",
           "WeightManifest", "put_bucket", "iter_bucket_tensors", "BucketStream",
           "TRANSPORTS", "GLOO_BACKEND", "TRANSFER_BACKENDS", "resolve_transport", "resolve_transfer_backend"]

#: Values of ``learners(weight_sync_transport=...)``.
TRANSPORTS = ("vllm", "object_store", "shared_memory", "collective", "auto", "driver")
