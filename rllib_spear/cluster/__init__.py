"""The run and the Ray cluster: Ray started lean for a run that lives in the driver
(``local_ray.init_ray``), and the refusal of actors the cluster can never hold, before any starts
(``resource_check``; docs/design.md "Fault tolerance"). Where each actor lands on the cluster's
GPUs is env_runners/placement.py (the runners' bundles) and pipelines/colocation.py (the
colocated pairs)."""
