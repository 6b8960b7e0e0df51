"""One rig per broker for bench/watchers.py: start the broker, run each variant's cell on it."""
