"""The case size classes, cumulative (a run of `small` also runs every `tiny` case). Their own
module, importing nothing: the command lines and the pytest plugin name them before anything
heavy (torch) is imported."""

SIZES = ("tiny", "small", "large")
