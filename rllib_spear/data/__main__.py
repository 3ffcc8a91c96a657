"""``python -m rllib_spear.data [--out DIR] [--seed N]``: write the embedded datasets."""
import argparse

from rllib_spear.data import default_paths, generate_all

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--out", default=None, help="output directory (default: the cache directory)")
p.add_argument("--seed", type=int, default=1234)
a = p.parse_args()
paths = generate_all(a.out, a.seed) if a.out else default_paths(a.seed)
for k, v in paths.items():
    print(f"{k}\t{v}")
