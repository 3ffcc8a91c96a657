"""RLlib Algorithms: GRPO, Dr.BoT, SPEAR, SPADER."""
