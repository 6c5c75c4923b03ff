"""Lanes: one YAML per GPU class, GPU-class detection and the lane runner. Kept empty of
imports so that the xdist plugin (`selgate.lanes.xdist_gpu`) loads before anything heavy."""
