"""SIGTERM and Ctrl-C (SIGINT) during training: stop after the current step, or at once when stuck.

A signal only notes that the run should stop. The training loop reads the note after every
step (under DDP it shares rank 0's note with every process), raises ``SIGTERMException``, and
``LastCheckpoint`` saves ``last.ckpt`` before the process exits with status 128 + the signal's
number (143 for SIGTERM, 130 for SIGINT).

Python runs a signal handler only between two calls of the main thread, so a process stuck in
one call, such as a collective operation waiting for a DDP process that is gone, would never
see the note. A watcher thread therefore hears every signal too, through the interpreter's
wakeup file descriptor, and ends the process itself when the note has not been taken within
``STUCK_AFTER_S`` seconds, or at once on a second Ctrl-C.
"""

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Longer than any single call of a healthy training step or checkpoint write.
STUCK_AFTER_S = 30.0

_received: list[signal.Signals] = []


def received_signal() -> signal.Signals | None:
    """The first signal that asked this process to stop, if any."""
    return _received[0] if _received else None


def _say(line: str) -> None:
    # Straight to the file descriptor: a handler or thread must not wait for a lock on sys.stderr.
    os.write(2, f"\n{line}\n".encode())


def stop_on_signals(
    request_stop: Callable[[], None], on_forced_exit: Callable[[], None], speak: bool
) -> Callable[[], None]:
    """Route SIGTERM and SIGINT to ``request_stop``, which must only note the request; returns
    the function that puts the previous handlers back and ends the watcher.

    ``on_forced_exit`` runs before the process ends without saving (for example to end the DDP
    processes this one started); ``speak`` is whether this process prints (rank 0 only).
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    taken: list[int] = []  # one entry per signal whose handler has run

    def note(signum: int, _: Any) -> None:
        taken.append(signum)
        if not _received:
            _received.append(signal.Signals(signum))
            if speak:
                again = " (Ctrl-C again to stop at once, without saving)" if signum == signal.SIGINT else ""
                _say(f"{signal.Signals(signum).name}: stopping after this step and saving last.ckpt{again}")
        request_stop()

    previous = {signum: signal.signal(signum, note) for signum in STOP_SIGNALS}
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read, taken, on_forced_exit, speak), daemon=True).start()

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous_wakeup)
        os.close(write)  # the watcher reads the end of the pipe and returns

    return restore


def _watch(read: int, taken: list[int], on_forced_exit: Callable[[], None], speak: bool) -> None:
    heard = interrupts = 0
    while data := os.read(read, 1):
        signum = signal.Signals(data[0])
        if signum not in STOP_SIGNALS:
            continue
        heard += 1
        interrupts += signum == signal.SIGINT
        if interrupts > 1:
            _force_exit(signum, "Ctrl-C twice: stopping at once", on_forced_exit, speak)
        deadline = time.monotonic() + STUCK_AFTER_S
        while len(taken) < heard and time.monotonic() < deadline:
            time.sleep(0.1)
        if len(taken) < heard:
            reason = (
                f"{signum.name} found the process stuck in one operation for {STUCK_AFTER_S:.0f} s (a "
                "collective operation waits for every DDP process, and one may be gone)"
            )
            _force_exit(signum, reason, on_forced_exit, speak)
    os.close(read)


def _force_exit(signum: signal.Signals, reason: str, on_forced_exit: Callable[[], None], speak: bool) -> None:
    if speak:
        _say(f"error: {reason}: exiting without saving; last.ckpt keeps its last save")
    on_forced_exit()
    os._exit(128 + signum)
