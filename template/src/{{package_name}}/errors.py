"""The error for settings that cannot work, found once the data and the model are set up."""


class ConfigError(ValueError):
    """A setting that cannot work with this data or model. The command line prints its message
    as a one-line error, as it does for errors found while parsing, not as a traceback."""
