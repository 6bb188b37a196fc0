"""A sweep's workers: each runs trials one after another, every trial one fit in a process of its
own (forked from a warm server, ``warm.py``, unless the sweep file says ``start: cold``), until the
study holds its budget; a trial killed with its worker is tried again, resuming its run; several
workers on this machine with ``--workers``."""

import contextlib
import itertools
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from ..runs.directory import LAST_CHECKPOINT, RUNS_DIR, wait_until_free
from ..runs.experiments import RECORD_FILE, read_lines
from .report import shown
from .spec import SweepError, budget_of, suggest
from .study import LOST, STORAGE_VARIABLE, SWEEPS_DIR, fail_stale, retry
from .warm import alive, start

PACKAGE = __name__.partition(".")[0]
TRIAL_CALLBACK = f"{PACKAGE}.framework.sweeps.trial.SweepTrial"
FAILURES_IN_A_ROW = 3
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
WAIT_S = 5  # how often a worker with no trial left to start looks at the others'


# Optuna's warnings of a failed trial, the first with the traceback of the worker's own exception:
# the worker says why in one line instead.
OPTUNA_FAILED_TRIAL = re.compile(r"Trial \d+ failed with ")


class Stopped(Exception):
    """The worker was asked to stop (Ctrl-C, SIGTERM); its trial is tried again later."""


class TrialFailed(Exception):
    """The trial's fit failed by itself; its output says why."""


class OverBudget(TrialFailed):
    """Another worker started the budget's last trial between this worker's count and its start."""


def quiet_optuna() -> None:
    """Optuna's logging: warnings only, without its lines of a failed trial."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for handler in logging.getLogger("optuna").handlers:
        handler.addFilter(lambda record: not OPTUNA_FAILED_TRIAL.match(record.getMessage()))


PRINT_CONFIG_S = 300  # longer than reading fit's config takes on a loaded machine


def fit_settings(fit_args: list[str], warm: bool = True) -> dict[str, Any]:
    """The config that every trial's fit starts from: ``fit --print_config`` with ``fit_args``,
    which parses the command line without building anything; or a SweepError with fit's reason."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = start(["fit", *fit_args, "--print_config"], stdout=out, stderr=err, warm=warm)
        try:
            returncode = process.wait(timeout=PRINT_CONFIG_S)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            raise SweepError(
                f"fit --print_config did not end in {PRINT_CONFIG_S} s: does a module wait on import?"
            ) from None
        printed, said = (file.seek(0) or file.read() for file in (out, err))
    if returncode != 0:
        said = [line for line in said.splitlines() if line.strip()] or [f"status {returncode}"]
        reason = next((line for line in said if line.startswith("error: ")), said[-1])
        raise SweepError(f"fit refuses the arguments after --: {reason.removeprefix('error: ')}")
    try:
        return yaml.safe_load(printed) or {}
    except yaml.YAMLError:  # a module that prints as it is imported, before the config
        first = printed.strip().splitlines()[0][:80]
        raise SweepError(
            f"fit --print_config printed more than its config, starting {first!r}: does a module print "
            "when imported?"
        ) from None


def run_here_or_launch(worker: "Worker", script: str, words: list[str], workers: int) -> int | None:
    """Run ``worker``'s trials in this process, or start ``workers`` worker processes of ``script``
    (each given ``words``) and wait for them: the status to exit with at once, or None when this
    process goes on to report the study."""
    if workers > 1:
        return launch(script, words, workers) or None
    worker.run()
    return 0 if "SWEEP_WORKER" in os.environ else None  # the command that started the workers reports


def worker_id() -> dict[str, Any]:
    """Who runs a trial: this process, and the Slurm job task it belongs to."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID", os.environ.get("SLURM_JOB_ID"))
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    return {"host": socket.gethostname(), "pid": os.getpid(), "slurm": job and f"{job}_{task}"}


def retry_killed(study: optuna.Study) -> None:
    """Mark failed the running trials whose worker is gone, and queue each again with its values
    and run: a worker of this machine whose process has ended, or an earlier start of this Slurm
    job task (requeued). A worker gone on another machine is found by its heartbeat instead
    (``fail_stale``), on a database storage."""
    me = worker_id()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get("worker")
        if not worker or (worker["pid"] == me["pid"] and worker["host"] == me["host"]):
            continue
        same_task = me["slurm"] is not None and worker["slurm"] == me["slurm"]
        if same_task or (worker["host"] == me["host"] and not alive(worker["pid"])):
            try:
                study.tell(trial.number, state=TrialState.FAIL)
            except ValueError:  # another worker was first
                continue
            print(f"trial {trial.number} was killed with its worker: trying it again", flush=True)
            retry(study, trial.number, trial.params, trial.user_attrs["run_name"])


def fit_line(run_name: str, since: int) -> dict[str, Any] | None:
    """The fit line that ``run_name`` wrote after the record's first ``since`` bytes, if any; a line
    damaged by hand or by a crash is not this trial's (scripts/report.py names it)."""
    if not RECORD_FILE.is_file():
        return None
    lines = read_lines(RECORD_FILE, since)
    fits = [line for line in lines if (line.get("run_name"), line.get("stage")) == (run_name, "fit")]
    return fits[-1] if fits else None


def runs_dir_of(fit_args: list[str]) -> Path:
    """The runs directory the trials' fits write into: their last ``--runs_dir``, or the default."""
    runs_dir = RUNS_DIR
    for option, value in itertools.pairwise([*fit_args, ""]):
        if option == "--runs_dir":
            runs_dir = Path(value)
        elif option.startswith("--runs_dir="):
            runs_dir = Path(option.removeprefix("--runs_dir="))
    return runs_dir


class Worker:
    """Runs trials of one study, one after another, until it holds its budget of finished or
    pruned trials (counting those other workers are running)."""

    def __init__(self, sweep: dict[str, Any], study: optuna.Study, storage: str, fit_args: list[str]) -> None:
        self.sweep, self.study, self.storage, self.fit_args = sweep, study, storage, fit_args
        self.runs_dir = runs_dir_of(fit_args)
        self.budget = budget_of(sweep)
        # A worker started by --workers writes each trial's output to a file; the others, to the
        # terminal (a Slurm task's, to its output file).
        self.log_dir = SWEEPS_DIR / sweep["name"] / "logs" if "SWEEP_WORKER" in os.environ else None
        self.outcome: type[Exception] | None = None  # how its last trial failed, if it did
        # Seconds between heartbeats, on a storage that keeps them (a database); None on a journal.
        self.heartbeat = None if storage.endswith(".journal") else sweep["heartbeat_interval"]
        self.warm = sweep["start"] == "warm"

    def run(self) -> None:
        failures, waiting = 0, False
        while True:
            retry_killed(self.study)
            fail_stale(self.study)
            trials = self.study.get_trials(deepcopy=False)
            finished = sum(trial.state in FINISHED for trial in trials)
            running = sum(trial.state == TrialState.RUNNING for trial in trials)
            if finished + running >= self.budget:
                if not running:
                    return
                if self.heartbeat is None:
                    print(f"the last {running} trials are running in other workers", flush=True)
                    return
                # One of them may yet lose its worker, and be this worker's to try again.
                if not waiting:
                    print(f"waiting for the last {running} trials, running in other workers", flush=True)
                waiting = True
                time.sleep(min(self.heartbeat, WAIT_S))
                continue
            waiting, self.outcome = False, None
            try:
                self.study.optimize(self.objective, n_trials=1, catch=(TrialFailed,))
            except UnboundLocalError as error:
                # Optuna's clean-up fails so when the storage fails as the trial's end is told.
                lost = error.__context__
                if isinstance(lost, LOST):
                    raise lost from lost.__cause__  # the cause holds the database's reason
                raise
            if self.outcome is OverBudget:
                return
            failures = failures + 1 if self.outcome is TrialFailed else 0
            if failures >= FAILURES_IN_A_ROW:
                raise SweepError(f"{failures} trials in a row failed; their output above says why")

    def objective(self, trial: optuna.Trial) -> float:
        try:
            return self._trial(trial)
        except TrialFailed as error:
            self.outcome = type(error)
            print(f"[trial {trial.number}] failed: {error}", flush=True)
            raise

    def _trial(self, trial: optuna.Trial) -> float:
        values = {name: suggest(trial, name, spec) for name, spec in self.sweep["parameters"].items()}
        earlier = self.study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
        if sum(other.number < trial.number for other in earlier) >= self.budget:
            raise OverBudget("another worker started the budget's last trial first")
        # A trial tried again resumes its run from the last checkpoint, if the run saved one.
        run_name = trial.user_attrs.get("run_name", "")
        resume = bool(run_name) and (self.runs_dir / run_name / LAST_CHECKPOINT).is_file()
        if resume:
            wait_until_free(self.runs_dir / run_name)
        else:
            run_name = self.run_name_of(trial, values)
        trial.set_user_attr("run_name", run_name)
        trial.set_user_attr("worker", worker_id())
        goal = "max" if self.sweep["direction"] == "maximize" else "min"
        callback = {
            "class_path": TRIAL_CALLBACK,
            "init_args": {
                "study": self.sweep["name"],
                "trial_id": trial._trial_id,
                "monitor": self.sweep["metric"],
                **{key: self.sweep[key] for key in ("pruner", "startup_trials", "warmup_epochs")},
            },
        }
        command = [
            *["fit", f"--run_name={run_name}", *self.fit_args],
            *(["--ckpt_path=last"] if resume else []),
            *[f"--checkpoint.monitor={self.sweep['metric']}", f"--checkpoint.mode={goal}"],
            *(
                f"--{name}={value if isinstance(value, str) else json.dumps(value)}"
                for name, value in values.items()
            ),
            f"--trainer.callbacks+={json.dumps(callback)}",
        ]
        chosen = ", ".join(f"{name.rsplit('.', 1)[-1]}={shown(value)}" for name, value in values.items())
        print(f"[trial {trial.number}] {run_name}{' (resumed)' if resume else ''}: {chosen}", flush=True)
        since = RECORD_FILE.stat().st_size if RECORD_FILE.is_file() else 0
        try:
            returncode = self._fit(command, run_name)
        except (Stopped, KeyboardInterrupt):
            retry(self.study, trial.number, trial.params, run_name)
            raise
        line = fit_line(run_name, since)
        stopped = returncode in (130, 143, -signal.SIGKILL, -signal.SIGTERM)
        if stopped or (line is not None and line["status"] == "interrupted"):
            # The fit alone was stopped or killed (the out-of-memory killer, say): try it again.
            retry(self.study, trial.number, trial.params, run_name)
            raise TrialFailed(f"its fit was stopped (status {returncode}); it is tried again")
        if returncode != 0 or line is None:
            raise TrialFailed(f"its fit exited with status {returncode}")
        if line["status"] == "pruned":
            print(f"[trial {trial.number}] pruned after epoch {line['epochs'] - 1}", flush=True)
            raise optuna.TrialPruned()
        if line["best_value"] is None:
            raise TrialFailed(f"its fit recorded no best {self.sweep['metric']}")
        print(f"[trial {trial.number}] {self.sweep['metric']} {line['best_value']:.4f}", flush=True)
        return line["best_value"]

    def run_name_of(self, trial: optuna.Trial, values: dict[str, Any]) -> str:
        """The run of a trial tried for the first time, by its ``values``."""
        return f"{self.sweep['name']}-{trial.number}"

    def _fit(self, args: list[str], run_name: str) -> int:
        """Run ``python -m <package> *args``, the trial's command, in a process group of its own
        that gets SIGTERM when this worker ends, however it ends, so that no fit trains on beside
        the trial tried again; the command's exit status."""
        output = None
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            output = (self.log_dir / f"{run_name}.log").open("a")
        env = {**os.environ, STORAGE_VARIABLE: self.storage}
        process = start(
            args, env, stdout=output, stderr=subprocess.STDOUT if output else None, warm=self.warm
        )
        try:
            return process.wait()
        except (Stopped, KeyboardInterrupt) as stop:
            # Passed on: the fit saves last.ckpt and exits (unless it has just ended).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM if isinstance(stop, Stopped) else signal.SIGINT)
            process.wait()
            raise
        finally:
            if output:
                output.close()


def stop(signum: int, _: Any) -> None:
    """The SIGTERM handler of a worker: stop its trial, to be tried again."""
    raise Stopped(signal.Signals(signum).name)


def launch(script: str, words: list[str], workers: int) -> int:
    """Start ``workers`` workers of ``script`` with ``words`` (its arguments, less ``--workers``) and
    wait for them; the status of the first that failed."""
    processes = []
    gpus = _gpu_count()
    for index in range(workers):
        env = {**os.environ, "SWEEP_WORKER": str(index)}
        if gpus > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
            env["CUDA_VISIBLE_DEVICES"] = str(index % gpus)  # one GPU each, shared if fewer
        processes.append(subprocess.Popen([sys.executable, script, *_without_workers(words)], env=env))
    try:
        statuses = [process.wait() for process in processes]
    except Stopped:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        statuses = [process.wait() for process in processes]
    return next((status for status in statuses if status), 0)


def _without_workers(words: list[str]) -> list[str]:
    kept, skip = [], False
    for word in words:
        if skip or word.startswith("--workers="):
            skip = False
            continue
        skip = word == "--workers"
        if not skip:
            kept.append(word)
    return kept


def _gpu_count() -> int:
    try:
        listed = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return 0
    return len(listed.stdout.splitlines())
