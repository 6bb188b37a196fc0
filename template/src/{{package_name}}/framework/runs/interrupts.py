"""SIGTERM and Ctrl-C (SIGINT) during training: stop after the current step, or at once when stuck.

A signal only notes that the run should stop (``requested``). ``LastCheckpoint`` reads the
note after every optimizer step (under DDP, at steps about a quarter of a second apart, where
every process agrees on it, so that all stop at the same step), raises ``SIGTERMException`` and
saves ``last.ckpt``; the process then exits with
status 128 + the signal's number (143 for SIGTERM, 130 for SIGINT).

A process stuck in one call, such as a collective operation waiting for a DDP process that is
gone, never ends its step, and Python runs a signal handler only between two calls of the main
thread. A watcher thread therefore hears every signal too, through the interpreter's wakeup
file descriptor, and ends the process itself when no batch has ended for ``patience_s`` seconds
after a signal, or at once on a second Ctrl-C.
"""

import ctypes
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[signal.Signals] = []
# PR_SET_PDEATHSIG's call, looked up here rather than between a fork and an exec (preexec_fn).
_prctl = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None


def received_signal() -> signal.Signals | None:
    """The first signal that asked this process to stop, if any."""
    return _received[0] if _received else None


def end_with_parent(parent: int | None = None) -> None:
    """Have the kernel send SIGTERM to this process when its parent ends, however it ends (SIGKILL
    too; Linux only). ``parent``: the pid the parent had, for a process that runs this before its
    program starts (``preexec_fn``), which ends at once if that parent already ended.

    A DDP process started by another one (Lightning's launcher, torchrun) would otherwise wait
    forever in a collective operation when its parent ends on an error; a warm server or trial,
    or a fit whose sweep worker is killed, would go on alone.
    """
    if _prctl is not None:
        _prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:  # the parent ended before the line above
        os._exit(1)


def _say(line: str) -> None:
    # Straight to the file descriptor: a handler or thread must not wait for a lock on sys.stderr.
    os.write(2, f"\n{line}\n".encode())


class StopOnSignals:
    """Notes SIGTERM and SIGINT in ``requested`` from ``start()`` until ``stop()``. The run calls
    ``alive()`` whenever a batch ends, and ``acknowledge()`` once it is stopping.

    Args:
        on_forced_exit: runs before the process ends without saving (for example to end the
            DDP processes this one started).
        speak: whether this process prints (rank 0 only).
        patience_s: how long after a signal the run may go without ending a batch.
    """

    def __init__(self, on_forced_exit: Callable[[], None], speak: bool, patience_s: float) -> None:
        self.requested = False
        self.on_forced_exit = on_forced_exit
        self.speak = speak
        self.patience_s = patience_s
        self._acknowledged = threading.Event()
        self._last_batch = time.monotonic()
        self._previous: dict[int, Any] = {}
        self._previous_wakeup = -1
        self._write = -1

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        self._previous = {signum: signal.signal(signum, self._note) for signum in STOP_SIGNALS}
        read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous_wakeup = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read,), daemon=True).start()

    def alive(self) -> None:
        self._last_batch = time.monotonic()

    def acknowledge(self) -> None:
        self._acknowledged.set()

    def stop(self) -> None:
        """Put the previous handlers back and end the watcher."""
        if self._write < 0:
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._previous_wakeup)
        os.close(self._write)  # the watcher reads the end of the pipe and returns
        self._write = -1

    def _note(self, signum: int, _: Any) -> None:
        if not _received:
            _received.append(signal.Signals(signum))
            if self.speak:
                again = " (Ctrl-C again to stop at once, without saving)" if signum == signal.SIGINT else ""
                _say(f"{signal.Signals(signum).name}: stopping after this step and saving last.ckpt{again}")
        self.requested = True

    def _watch(self, read: int) -> None:
        signalled, interrupts = False, 0
        while True:
            deadline = self._last_batch + self.patience_s
            wait = max(0.0, deadline - time.monotonic()) if signalled else None
            if not select.select([read], [], [], wait)[0]:
                if self._acknowledged.is_set():
                    signalled = False  # stopping as asked; only a second Ctrl-C matters now
                elif time.monotonic() >= self._last_batch + self.patience_s:
                    self._force_exit(
                        _received[0] if _received else signal.SIGTERM,
                        f"no batch ended within {self.patience_s:g} s (the process is stuck in one "
                        "operation, such as a collective operation waiting for a DDP process that is gone)",
                    )
                continue
            data = os.read(read, 1)
            if not data:
                break
            signum = signal.Signals(data[0])
            if signum not in STOP_SIGNALS:
                continue
            interrupts += signum == signal.SIGINT
            if interrupts > 1:
                self._force_exit(signum, "Ctrl-C twice: stopping at once")
            if not signalled:
                signalled = True
                self._last_batch = max(self._last_batch, time.monotonic())
        os.close(read)

    def _force_exit(self, signum: signal.Signals, reason: str) -> None:
        if self.speak:
            _say(f"error: {signum.name}: {reason}; exiting without saving; last.ckpt keeps its last save")
        self.on_forced_exit()
        os._exit(128 + signum)
