"""Weights & Biases, run beside the training rather than inside it.

Lightning's ``WandbLogger`` imports wandb and starts its run in the training process, before the
first step, and each logging call then takes time from the step. This logger starts a process of its
own for the run (``wandb_process.py``) before a fit, or when there is first something to log, and
sends it what to log as lines on a pipe; the training goes on meanwhile, on the machine's other
cores. The run is an ordinary wandb run, offline by default: ``wandb sync`` uploads it, and online
it logs live.

For what this logger does not offer (artifacts, ``watch``, logging checkpoints), configure
``lightning.pytorch.loggers.WandbLogger`` instead: the project supports both.
"""

import contextlib
import json
import os
import secrets
import string
import subprocess
import sys
import weakref
from argparse import Namespace
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from .console import is_verbose

PROCESS = Path(__file__).with_name("wandb_process.py")
# Seconds the end of a command waits for the wandb process to finish its run (an online run may
# still be uploading): long enough for an offline run on a loaded machine.
FINISH_WITHIN_S = 300
# The loggers whose wandb process runs, to finish if a command fails outside Lightning's handling.
_running: "weakref.WeakSet[WandbLogger]" = weakref.WeakSet()


def new_run_id() -> str:
    """A run id as wandb makes them (8 lowercase letters and digits), drawn without touching the
    random number generators that training draws from."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class WandbLogger(Logger):
    """Logs to a Weights & Biases run held by a process of its own.

    Args:
        save_dir: where wandb writes the run (``<save_dir>/wandb/``); the CLI sets the run directory.
        project: the wandb project.
        name: the run's name; the CLI sets ``--run_name``.
        id: the run's id, to continue a run; by default a new one (the CLI continues the run of
            a resumed checkpoint). ``wandb agent`` gives its own, which is kept.
        offline: write the run to disk only, for ``wandb sync`` later.
        entity: the wandb team or user.
        group: group runs together, e.g. the trials of a sweep.
        tags: tags of the run.
        notes: a description of the run.
        job_type: the kind of run, e.g. ``train``.
        settings: other ``wandb.Settings``, e.g. ``{console: wrap}``.
    """

    def __init__(
        self,
        save_dir: str = ".",
        project: str | None = None,
        name: str | None = None,
        id: str | None = None,
        offline: bool = True,
        entity: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        job_type: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self._save_dir = save_dir
        self._project = project
        self._id = id or os.environ.get("WANDB_RUN_ID") or new_run_id()
        self._init = {
            "dir": save_dir,
            "project": project,
            "name": name,
            "id": self._id,
            "resume": "allow",
            "mode": "offline" if offline else "online",
            "entity": entity,
            "group": group,
            "tags": tags,
            "notes": notes,
            "job_type": job_type,
            "settings": settings or {},
        }
        self._process: subprocess.Popen | None = None
        self._begun = False  # the run has begun: the process has wandb.init's arguments
        self._lost = False  # the process ended early; what follows is not logged

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the loggers into its processes; rank 0's starts a wandb process there.
        return {**self.__dict__, "_process": None, "_begun": False}

    @property
    def name(self) -> str | None:
        return self._project

    @property
    def version(self) -> str:
        return self._id

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def output(self) -> Path:
        """The file that keeps what the wandb process printed."""
        return Path(self._save_dir) / "wandb" / "process.log"

    @rank_zero_only
    def start(self) -> None:
        """Start the wandb process now rather than at the first thing logged. It imports wandb and
        starts wandb's service, about a second of CPU, beside what the command does meanwhile: the
        CLI starts it before a fit, so that under DDP this overlaps the other processes' start. The
        run itself begins at the first thing logged, so a command that fails before has none."""
        if self._process is not None or self._lost:
            return
        self.output.parent.mkdir(parents=True, exist_ok=True)
        with self.output.open("a") as output:
            # In this process group, so that whatever ends the whole group ends it too.
            command = [sys.executable, str(PROCESS)]
            shown = None if is_verbose() else output  # --verbose: wandb's lines on the terminal
            self._process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=shown, stderr=shown, text=True
            )
        _running.add(self)

    def _send(self, kind: str, **message: Any) -> None:
        if self._lost:
            return
        if not self._begun:
            self.start()
            self._write(self._init)
            self._begun = True
        self._write({"kind": kind, **message})

    def _write(self, message: dict[str, Any]) -> None:
        try:
            self._process.stdin.write(json.dumps(message, default=str) + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            self._lost = True
            rank_zero_warn(f"the wandb run ended early; training goes on without it (see {self.output})")

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        self._send("hyperparameters", values=vars(params) if isinstance(params, Namespace) else dict(params))

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self._send("metrics", values=dict(metrics), step=step)

    @rank_zero_only
    def log_image(self, key: str, images: list[str | Path], step: int | None = None) -> None:
        """Log image files under ``key``."""
        self._send("images", key=key, paths=[str(path) for path in images], step=step)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Finish the run, and wait for the process to write it. Lightning calls this at the end
        of every fit, validate, test and predict."""
        if self._process is None:
            return
        if not self._lost:  # before the run has begun, it ends the process: no run
            self._write({"kind": "finish", "exit_code": 0 if status == "success" else 1})
        process, self._process, self._begun = self._process, None, False
        _running.discard(self)
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            code = process.wait(timeout=FINISH_WITHIN_S)
        except subprocess.TimeoutExpired:
            rank_zero_warn(f"the wandb run is still finishing after {FINISH_WITHIN_S} s; see {self.output}")
            return
        if code != 0:
            rank_zero_warn(f"the wandb run ended with exit status {code}; see {self.output}")


def finish_runs() -> None:
    """Finish, as failed, the wandb runs that a failed command left running in this process."""
    for logger in list(_running):
        logger.finalize("failed")


def end_tracking() -> None:
    """Finish the wandb runs a failed command left open (Lightning finishes the others) and stop
    wandb's service, so that the next command in this process (in a test or a notebook) starts
    afresh, not in the state this one left."""
    finish_runs()
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        if wandb.run is not None:
            wandb.run.finish(exit_code=1)
        wandb.teardown()
