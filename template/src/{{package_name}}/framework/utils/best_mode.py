"""Which way a monitored metric is best: the project's own metrics by their names; a metric of
the user's own as its config says, never guessed."""

from ..errors import UsageError

# The mode each kind of metric is best at, by the last part of its name (val/loss: loss).
BEST_MODE = {
    **{"loss": "min", "loss_epoch": "min", "acc": "max", "f1": "max"},  # classification
    **{"mae": "min", "rmse": "min", "r2": "max"},  # regression
}


def best_mode(monitor: str | None, mode: str | None, key: str = "checkpoint") -> str:
    """``mode`` when it is given; else the mode at which the project's metric ``monitor`` is best,
    or a UsageError that asks for ``<key>.mode`` for a metric the project does not know."""
    if mode is not None:
        return mode
    if monitor is None:  # no metric to keep the best epoch by
        return "min"
    known = BEST_MODE.get(monitor.rsplit("/", 1)[-1])
    if known is None:
        raise UsageError(
            f"{key}.monitor={monitor} is not one of the project's metrics, so which way it is best is "
            f"not known: set {key}.mode=max if a higher {monitor} is better, or {key}.mode=min if a lower one is"
        )
    return known
