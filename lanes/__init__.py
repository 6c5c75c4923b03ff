"""Lanes: one YAML per GPU class, GPU-class detection and the lane runner."""
from .config import LANE_DIR, lane_names, load_lane
from .detect import detect_lane

__all__ = ["LANE_DIR", "lane_names", "load_lane", "detect_lane"]
