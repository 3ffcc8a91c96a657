"""GRPO and Dr.BoT baselines: the shared config, algorithm and learner."""
from .config import DrBoTConfig, GRPOConfig
from .grpo import GRPO, DrBoT

__all__ = ["GRPOConfig", "GRPO", "DrBoTConfig", "DrBoT"]
