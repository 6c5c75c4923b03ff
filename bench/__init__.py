"""Benchmarks of selection attention against its baselines, the threshold optimiser that
turns a sweep into a device profile, and the regression rule of the release gate."""
