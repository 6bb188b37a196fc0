"""The errors a command prints as one line: settings refused while the command line is read, and
settings that cannot work, found once the data and the model are set up."""


class UsageError(ValueError):
    """A setting refused while the command line is read, before anything is built: printed as the
    parser prints its own errors."""


class ConfigError(ValueError):
    """A setting that cannot work with this data or model. The command line prints its message
    as a one-line error, as it does for errors found while parsing, not as a traceback."""


def message_of(error: BaseException) -> str:
    """An error's message as written: ``str()`` quotes a ``KeyError``'s, and an ``OSError`` raised
    with an errno has the errno first in its ``args``."""
    return str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
