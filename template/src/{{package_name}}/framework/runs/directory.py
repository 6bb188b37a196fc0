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
  process), so two processes never train in one run at once. The lock is taken before the
  directory is looked at, so of two commands started together with one run name, the second is
  told the first trains there, never that the directory is stale. The operating system releases
  the lock when the process ends, however it ends, so a killed run leaves none behind. It is a
  POSIX record lock (``lockf``), which belongs to the process alone: the loader workers it forked,
  which may outlive it by seconds, do not hold it.
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
HOLDER_TRIES = 20  # a second, at most, for a process that has just taken a lock to write its number
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


def check_runs_dir(runs_dir: Path) -> None:
    """Refuse a ``--runs_dir`` that is a file, or lies below one, before anything is made."""
    for path in (runs_dir, *runs_dir.parents):
        if path.exists() and not path.is_dir():
            where = "is a file" if path == runs_dir else f"is below {path}, which is a file"
            raise RunDirectoryError(f"--runs_dir={runs_dir} {where}, not a folder: choose a folder")


def claim(run_dir: Path, resumed: bool) -> None:
    """Refuse ``run_dir`` unless it is new or ``resumed``, then lock it for this process. A process
    training there is named, whatever the directory holds."""
    key = run_dir.resolve()
    if key in _held:
        return
    if not resumed and _holds_a_run(run_dir):
        if (run_dir / LOCK_FILE).is_file():
            _lock(run_dir, note=False).close()  # refused, naming the process, if one trains there
        _refuse_held(run_dir)
    file = _lock(run_dir)
    if not resumed and _holds_a_run(run_dir):  # a run made and ended there since the look above
        file.close()
        _refuse_held(run_dir)
    _held[key] = file


def _holds_a_run(run_dir: Path) -> bool:
    return run_dir.is_dir() and any(path.name != LOCK_FILE for path in run_dir.iterdir())


def _refuse_held(run_dir: Path) -> None:
    last = run_dir / LAST_CHECKPOINT
    held = "a run that saved no checkpoint"
    if last.is_file():
        held = f"a run: resume it with --ckpt_path {last}"
    raise RunDirectoryError(f"{run_dir} already holds {held}; choose another --run_name, or delete it")


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


def _lock(run_dir: Path, note: bool = True) -> IO[str]:
    """The lock file of ``run_dir`` (made if new), locked for this process and, if ``note``, naming
    it at once (a process refused meanwhile reads the name)."""
    if not run_dir.parent.exists():
        _created_parents.add(run_dir.parent.resolve())
    try:
        made = _made(run_dir)
        file = (run_dir / LOCK_FILE).open("a+")
    except OSError as error:  # a dangling link, a folder that cannot be written
        raise RunDirectoryError(
            f"{run_dir} cannot be made ({error.strerror}): choose a --runs_dir you can write"
        ) from None
    try:
        fcntl.lockf(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by another process
        holder = _holder(file)
        file.close()
        who = f"process {holder}" if holder else "another process"
        raise RunDirectoryError(
            f"{run_dir} is in use by {who}, which is training in it; wait for it to end, or choose another "
            "--run_name"
        ) from None
    if made:  # removed if the start fails; a directory another process made is never removed here
        _created.add(run_dir.resolve())
    if note:
        file.seek(0)
        file.truncate()
        file.write(f"{os.getpid()}\n")
        file.flush()
    return file


def _holder(file: IO[str]) -> str:
    """The number of the process that holds the lock of ``file``, as it writes it right after
    taking the lock: waited for a moment, or empty."""
    for _ in range(HOLDER_TRIES):
        file.seek(0)
        if holder := file.read().strip():
            return holder
        time.sleep(0.05)
    return ""


def _made(run_dir: Path) -> bool:
    """Make ``run_dir``; whether it is new."""
    try:
        run_dir.mkdir(parents=True)
        return True
    except FileExistsError:
        if run_dir.is_file():
            raise RunDirectoryError(
                f"{run_dir} is a file, not a run's directory: choose another --run_name"
            ) from None
        if not run_dir.is_dir():  # a parent is a link to nothing
            raise
        return False


def wait_until_free(run_dir: Path, timeout_s: float = 120) -> None:
    """Wait until no process trains in ``run_dir`` (a killed run's process may still be saving)."""
    lock = run_dir / LOCK_FILE
    deadline = time.monotonic() + timeout_s
    while lock.is_file() and time.monotonic() < deadline:
        try:
            file = lock.open("r+")  # lockf takes a file open for writing; never makes one
        except FileNotFoundError:  # the run's directory went meanwhile
            return
        with file:
            try:
                fcntl.lockf(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError:
                time.sleep(0.5)
