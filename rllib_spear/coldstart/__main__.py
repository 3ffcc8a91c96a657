"""``python -m rllib_spear.coldstart``: rebuild and ship every cold start (``coldstart.ship.main``)."""
from rllib_spear.coldstart.ship import main

if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    main()
