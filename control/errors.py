"""The one exception type that the command line turns into a one-line error."""


class DSparkError(Exception):
    """A user-facing error: bad config, bad input file, impossible request.

    The message is a single line naming what is wrong and where; the CLI prints it as
    ``dspark: error: <message>`` and exits with status 2, never with a traceback.
    """


class ConfigError(DSparkError):
    """A config file or mapping that does not fit its dataclass."""
