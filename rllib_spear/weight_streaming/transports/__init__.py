"""The built-in weight-sync transports, one module each with its three sides (docs/design.md
"Weight streaming"): ``object_store`` (one Ray object per bucket, pipelined), ``shared_memory``
(runners on the learner's node read its weights in place), ``collective`` (a gloo broadcast to
a group of the sender and the runners), ``vllm`` (vLLM's own weight-transfer API) and
``driver`` (the whole state through the driver and RLlib's ``set_state``). Importing this
package registers them (``registry`` does, on its own import)."""
from . import collective, driver, object_store, shared_memory, vllm  # noqa: F401

__all__: list[str] = []
