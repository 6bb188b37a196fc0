"""Which way a monitored metric is best: the project's own metrics by their names; a metric of
the user's own as its config says, never guessed."""

# The mode each kind of metric is best at, by the last part of its name (val/loss: loss).
BEST_MODE = {
    **{"loss": "min", "loss_epoch": "min", "acc": "max", "f1": "max"},  # classification
    **{"mae": "min", "rmse": "min", "r2": "max"},  # regression
}


def best_mode(monitor: str | None, mode: str | None) -> str | None:
    """``mode`` when it is given; else the mode at which the project's metric ``monitor`` is best;
    None for a metric the project does not know, whose mode the user sets (``mode_needed``)."""
    if mode is not None or monitor is None:
        return mode or "min"  # without a monitor, no epoch is kept as the best
    return BEST_MODE.get(monitor.rsplit("/", 1)[-1])


def mode_needed(monitor: str, key: str = "checkpoint") -> str:
    """The refusal of ``monitor`` without ``<key>.mode``, for a metric the project does not know."""
    return (
        f"{key}.monitor={monitor} is not one of the project's metrics, so which way it is best is not "
        f"known: set {key}.mode=max if a higher {monitor} is better, or {key}.mode=min if a lower one is"
    )
