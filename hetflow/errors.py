"""The one-line error every layer raises for a bad value (`ConfigError`), at the very bottom:
it imports nothing, so that the pure performance model (`hetflow.perf`) raises the same error
as the config models (`hetflow.config.base` re-exports it)."""


class ConfigError(ValueError):
    """A bad configuration value: the message is one line and names the field."""
