"""Errors a backend raises to leave the fast path; each carries a reason code."""


class BackendUnavailable(RuntimeError):
    """The backend cannot serve this call (`reason` is a short stable code, e.g. 'head_dim')."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class StrictModeError(RuntimeError):
    """Strict mode: the requested backend could not run, and falling back is forbidden."""


class ConfigError(ValueError):
    """A malformed setting (an environment variable or a config value), named in the message.
    An explicitly requested backend raises it; `auto` falls back with reason 'config'."""
