"""selgate: a CI-gated validation harness and conformance suite for NSA selection attention."""

__version__ = "0.1.0"
