"""Run directories: every training run writes into ``<runs_dir>/<run_name>/``.

The rules, in one place:

- A run name is one directory name, so no run writes outside ``runs_dir``.
- A directory that holds files belongs to its run: only resuming from one of its checkpoints
  continues there. A command that fails before its run saved a checkpoint (on a setting, the
  data, an error in the first steps) removes the directories it made, so the same command can be
  run again at once.
- ``--ckpt_path last`` is the newest ``last.ckpt`` of the named run, or of any run: the run's
  latest state, to resume from. ``--ckpt_path best`` is the checkpoint that run kept by its
  monitored validation metric: the one to test, predict with and export.
- The process that trains in a directory holds its lock (the file ``.lock``, naming the
  process), so two processes never train in one run at once. The operating system releases
  the lock when the process ends, however it ends, so a killed run leaves none behind.
"""

import fcntl
import os
import re
import shutil
import time
from pathlib import Path
from typing import IO

RUNS_DIR = Path("checkpoints")  # the default of --runs_dir
LAST_CHECKPOINT = "last.ckpt"  # the newest checkpoint of a run, in its directory
LOCK_FILE = ".lock"
NAME = re.compile(r"[\w][\w.=+@-]*")

# The lock files this process holds, open for as long as it lives (a lock is per open file).
_held: dict[Path, IO[str]] = {}
_created: set[Path] = set()  # the run (and output) directories this process made
_created_parents: set[Path] = set()  # and the directories it made to hold them


class RunDirectoryError(ValueError):
    """A run name or directory that cannot serve this run; the message is one line."""


def check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise RunDirectoryError(
            f"--run_name={name!r} is not a directory name: use letters, digits and . _ - = + @, "
            "starting with a letter, digit or _ (no / or ..)"
        )


def run_of(checkpoint: Path, runs_dir: Path) -> str | None:
    """The name of the run whose directory holds ``checkpoint``, if it is in ``runs_dir``."""
    return checkpoint.parent.name if checkpoint.resolve().parent.parent == runs_dir.resolve() else None


def latest_checkpoint(runs_dir: Path, run_name: str | None, asked: str = "last") -> Path:
    """The newest ``last.ckpt`` of the run ``run_name``, or of any run in ``runs_dir``, for
    ``--ckpt_path {asked}``."""
    pattern = f"{run_name or '*'}/{LAST_CHECKPOINT}"
    found = sorted(runs_dir.glob(pattern), key=lambda path: path.stat().st_mtime)
    if not found:
        purpose = "to resume from" if asked == "last" else "naming the run's best checkpoint"
        raise RunDirectoryError(f"--ckpt_path {asked}: no {runs_dir / pattern} {purpose}")
    return found[-1]


def claim(run_dir: Path, resumed: bool) -> None:
    """Refuse ``run_dir`` unless it is new or ``resumed``, then lock it for this process."""
    if not resumed and run_dir.is_dir() and any(path.name != LOCK_FILE for path in run_dir.iterdir()):
        last = run_dir / LAST_CHECKPOINT
        held = "a run that saved no checkpoint"
        if last.is_file():
            held = f"a run: resume it with --ckpt_path {last}"
        raise RunDirectoryError(f"{run_dir} already holds {held}; choose another --run_name, or delete it")
    expect_new(run_dir)
    _lock(run_dir)


def expect_new(directory: Path) -> None:
    """Note that this process makes ``directory`` (and its parent, if new), to remove them if the
    start fails on a setting."""
    if not directory.parent.exists():
        _created_parents.add(directory.parent.resolve())
    if not directory.exists():
        _created.add(directory.resolve())


def end_command(failed: bool) -> None:
    """At the end of a command: if it failed, remove the directories it made that hold no
    checkpoint, and the parents it made for them if nothing else is in them, so that the same
    command can simply be run again. A run that saved a checkpoint keeps its directory."""
    for directory in _created if failed else ():
        if directory.is_dir() and not any(directory.rglob("*.ckpt")):
            release(directory)
            shutil.rmtree(directory, ignore_errors=True)
    for parent in _created_parents if failed else ():
        if parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
    _created.clear()
    _created_parents.clear()


def release(run_dir: Path) -> None:
    """Give up the lock of ``run_dir`` (it also goes when the process ends)."""
    file = _held.pop(run_dir.resolve(), None)
    if file is not None:
        file.close()


def _lock(run_dir: Path) -> None:
    key = run_dir.resolve()
    if key in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    file = (run_dir / LOCK_FILE).open("a+")
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        holder = file.read().strip() or "another process"
        file.close()
        raise RunDirectoryError(
            f"{run_dir} is in use by process {holder}, which is training in it; wait for it to end, "
            "or choose another --run_name"
        ) from None
    file.seek(0)
    file.truncate()
    file.write(f"{os.getpid()}\n")
    file.flush()
    _held[key] = file


def wait_until_free(run_dir: Path, timeout_s: float = 120) -> None:
    """Wait until no process trains in ``run_dir`` (a killed run's process may still be saving)."""
    lock = run_dir / LOCK_FILE
    deadline = time.monotonic() + timeout_s
    while lock.is_file() and time.monotonic() < deadline:
        with lock.open() as file:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(0.5)
