"""Runtime configuration files (base.yaml, per-device profiles, tuned launch parameters), shipped as package data."""
