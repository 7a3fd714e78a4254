"""Errors the CLI turns into one line, importable without torch (start-up stays fast)."""


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or inf; the message names the node and the model."""
