"""Suite-wide settings."""
import os

# Tune replaces the SIGINT handler on every fit() and restores it only when a signal arrives, so
# after a few Tune runs in one process Ctrl-C only peels one handler off per press: keep the
# default handler, so that Ctrl-C stops the suite at once (a build stops and leaves no cache entry).
os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
