"""``python -m rllib_spear.coldstart``: rebuild and ship every embedded cold start
(``coldstart.ship.main``); ``--smollm2``: build (or find in the cache) the SmolLM2-135M-Instruct
search cold start (``coldstart.smollm2``) and print its folder; ``--smollm2-tools``: the same for
its tool-use cold start (``coldstart.smollm2_tools``)."""
import argparse

if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    ap = argparse.ArgumentParser(prog="python -m rllib_spear.coldstart", description=__doc__)
    ap.add_argument("--smollm2", action="store_true",
                    help="build the SmolLM2 search cold start (model_path 'smollm2-search') instead of shipping "
                         "the embedded ones")
    ap.add_argument("--smollm2-tools", action="store_true",
                    help="build the SmolLM2 tool-use cold start (model_path 'smollm2-tools')")
    ap.add_argument("--rebuild", action="store_true", help="with --smollm2 / --smollm2-tools: rebuild even if cached")
    args = ap.parse_args()
    if args.smollm2_tools:
        from rllib_spear.coldstart.smollm2_tools import smollm2_tools_path

        print(smollm2_tools_path(build=args.rebuild))
    elif args.smollm2:
        from rllib_spear.coldstart.smollm2 import smollm2_search_path

        print(smollm2_search_path(build=args.rebuild))
    else:
        from rllib_spear.coldstart.ship import main

        main()
