"""The generated `scripts/slurm/train.sbatch` under a real Slurm: one node on this machine, with
munge, slurmctld and slurmd started in a temporary directory and stopped at the end.

A job is requeued the way a time limit does it (USR1 to the batch script, which requeues), and its
two-process DDP training resumes from last.ckpt to the same weights as a job never interrupted.
Its scontrol is slowed down, so that the requeue's SIGTERM always finds it still running and the
training ends while the batch script handles USR1.
A sweep runs as a job array whose two tasks are workers of one Optuna study, on its journal file,
and again on a real PostgreSQL server (tests/postgres.py).
Needs root and Debian's slurmctld, slurmd, slurm-client and munge; `.ci/run` installs them and
sets REQUIRE_SLURM=1, which turns a missing Slurm from a skip into a failure.
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from conftest import copy_template, install
from postgres import postgres

pytestmark = pytest.mark.slow

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo", "squeue")
SLURM_CONF = """\
ClusterName=local
SlurmctldHost={host}
SlurmctldPort={port}
SlurmdPort={port_d}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/ctld
SlurmdSpoolDir={root}/d
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName={host} CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=local Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
# Two tasks (DDP over gloo) on the two CPUs; the GPU line of the script is overridden. About 400
# steps, several seconds of training, so that the signal comes mid-run.
SBATCH = ["sbatch", "--parsable", "--ntasks-per-node=2", "--cpus-per-task=1", "--gpus-per-node=0"]
TRAINING = [
    "--config=configs/trainer/ddp_cpu.yaml",
    "--trainer.max_epochs=20",
    "--data.batch_size=32",
    "--trainer.enable_progress_bar=false",
    "--last_checkpoint.every_n_train_steps=5",
]


# Every command below answers in well under a second; a hung daemon fails the test instead of
# hanging it.
COMMAND_TIMEOUT = 60
# scontrol, slowed down after a requeue until the training's step has ended (20 s at most): the
# SIGTERM with which the requeue stops the job always reaches it before it exits, and the
# training exits while the batch script is still in its USR1 handler. Either happens now and then
# with the real scontrol; a batch script that died with its scontrol, or took the status of its
# interrupted `wait` for the training's, never logged "training exited with status 143".
SLOW_SCONTROL = """\
#!/bin/sh
{scontrol} "$@" || exit
if [ "$1" = requeue ]; then
    for _ in $(seq 100); do
        {scontrol} show step "$SLURM_JOB_ID.0" >/dev/null 2>&1 || break
        sleep 0.2
    done
    sleep 1
fi
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(condition, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def _stop(pid_file: Path) -> None:
    if pid_file.exists():
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


def _cancel_all(env: dict) -> None:
    """Cancel the jobs a failed test left, and wait for them: their processes would outlive the daemons."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(["scancel", "--partition=local"], env=env, timeout=COMMAND_TIMEOUT)
        deadline = time.monotonic() + COMMAND_TIMEOUT  # more than KillWait, 30 s
        while time.monotonic() < deadline:
            queue = subprocess.run(
                ["squeue", "-h"], capture_output=True, text=True, env=env, timeout=COMMAND_TIMEOUT
            )
            if not queue.stdout.strip():
                return
            time.sleep(0.5)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """The environment in which sbatch, scontrol and scancel talk to a one-node cluster on this machine."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing or os.geteuid() != 0:
        reason = f"needs root and Slurm with munge (missing: {', '.join(missing) or 'root'})"
        if os.environ.get("REQUIRE_SLURM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    # Short, since munge's socket path must fit in a Unix socket address.
    root = Path(tmp_path_factory.mktemp("slurm"))
    for name in ("ctld", "d"):
        (root / name).mkdir()
    root.chmod(0o755)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    subprocess.run(
        [
            "munged",
            "--force",
            f"--key-file={key}",
            f"--socket={root / 'munge.socket'}",
            f"--pid-file={root / 'munged.pid'}",
            f"--log-file={root / 'munged.log'}",
            f"--seed-file={root / 'munged.seed'}",
        ],
        check=True,
        timeout=COMMAND_TIMEOUT,
    )
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=host, port=_free_port(), port_d=_free_port(), root=root))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "SLURM_"))}
    env.update(SLURM_CONF=str(conf), PYTHON=sys.executable, WANDB_SILENT="true")
    try:
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env, timeout=COMMAND_TIMEOUT)
        subprocess.run(["slurmd", "-f", str(conf)], check=True, env=env, timeout=COMMAND_TIMEOUT)

        def node_idle() -> bool:
            states = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env, timeout=COMMAND_TIMEOUT
            )
            return states.stdout.strip() == "idle"

        _wait_for(node_idle, "the node to come up", timeout=60)
        yield env
    finally:
        if (root / "slurmctld.pid").exists():
            _cancel_all(env)
        for daemon in ("slurmd", "slurmctld", "munged"):
            _stop(root / f"{daemon}.pid")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    destination = copy_template(tmp_path_factory.mktemp("slurm-project") / "project", loggers=["csv"])
    install(destination)
    return destination


def _job(job_id: str, env: dict) -> dict[str, str]:
    """The job's fields as `scontrol show job` prints them (JobState, Restarts, ExitCode, ...)."""
    return dict(field.split("=", 1) for field in _shown_job(job_id, env, check=True) if "=" in field)


def _shown_job(job_id: str, env: dict, check: bool) -> list[str]:
    """The words of `scontrol show job -o`: its fields, a line for each task of an array."""
    shown = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id],
        capture_output=True,
        text=True,
        env=env,
        check=check,
        timeout=COMMAND_TIMEOUT,
    )
    return shown.stdout.split()


def _submit(project: Path, env: dict, *args: str) -> str:
    """Submit scripts/slurm/train.sbatch with ``args``; the job's id."""
    return _sbatch(project, env, *SBATCH, "scripts/slurm/train.sbatch", *args)


def _sbatch(project: Path, env: dict, *words: str) -> str:
    """Run the sbatch command ``words`` in ``project``; the job's id."""
    submitted = subprocess.run(
        words,
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def _finished(job_id: str, env: dict) -> dict[str, str]:
    _wait_for(lambda: _job(job_id, env)["JobState"] not in ("PENDING", "RUNNING", "COMPLETING"), "the job")
    return _job(job_id, env)


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]


def _step(checkpoint: Path) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"]


def test_requeued_job_resumes_to_the_weights_of_an_uninterrupted_one(slurm, project, tmp_path):
    reference = _submit(project, slurm, *TRAINING)
    job = _finished(reference, slurm)
    output = (project / "checkpoints" / f"slurm-{reference}.out").read_text()
    assert job["JobState"] == "COMPLETED", output[-3000:]
    reference_run = project / "checkpoints" / f"slurm-{reference}"

    slow = tmp_path / "slow-scontrol"
    slow.mkdir()
    (slow / "scontrol").write_text(
        SLOW_SCONTROL.format(scontrol=shutil.which("scontrol", path=slurm["PATH"]))
    )
    (slow / "scontrol").chmod(0o755)
    interrupted = _submit(project, {**slurm, "PATH": f"{slow}:{slurm['PATH']}"}, *TRAINING)
    run = project / "checkpoints" / f"slurm-{interrupted}"
    _wait_for(lambda: (run / "last.ckpt").exists(), "the first last.ckpt")
    # What Slurm does before the time limit (--signal=B:USR1@...): USR1 to the batch script.
    subprocess.run(
        ["scancel", "--signal=USR1", "--batch", interrupted], env=slurm, check=True, timeout=COMMAND_TIMEOUT
    )
    _wait_for(lambda: _job(interrupted, slurm)["Restarts"] == "1", "the requeue")
    # A requeued job waits two minutes before it may start again; let it start now.
    _wait_for(lambda: _job(interrupted, slurm)["JobState"] == "PENDING", "the job to be pending")
    stopped_at = _step(run / "last.ckpt")
    subprocess.run(
        ["scontrol", "update", f"JobId={interrupted}", "StartTime=now"],
        env=slurm,
        check=True,
        timeout=COMMAND_TIMEOUT,
    )
    job = _finished(interrupted, slurm)
    output = (project / "checkpoints" / f"slurm-{interrupted}.out").read_text()
    assert job["JobState"] == "COMPLETED", output[-3000:]

    # The first start saved on SIGTERM and exited as terminated, its batch script waiting for it
    # through the SIGTERM that the requeue sent to both; the second resumed its run.
    assert "time limit near: requeueing" in output
    assert "requeue failed" not in output, output[-3000:]
    assert "training exited with status 143" in output, output[-3000:]
    assert f"job {interrupted} start 1: run slurm-{interrupted}" in output
    assert len(list(run.rglob("config-resumed-*.yaml"))) == 1
    # One line per part of each job, written by rank 0 alone: the stop, then the resumed end.
    records = [json.loads(line) for line in (project / "experiments.jsonl").read_text().splitlines()]
    assert [(record["run_name"], record["status"]) for record in records] == [
        (f"slurm-{reference}", "finished"),
        (f"slurm-{interrupted}", "interrupted"),
        (f"slurm-{interrupted}", "finished"),
    ]

    expected, resumed = _weights(reference_run / "last.ckpt"), _weights(run / "last.ckpt")
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(expected[name], resumed[name]) for name in expected)
    assert 0 < stopped_at < _step(reference_run / "last.ckpt") == _step(run / "last.ckpt")


def _array_states(job_id: str, env: dict) -> list[str]:
    """The state of each task of a job array (one line each in `scontrol show job`)."""
    return [
        field.split("=", 1)[1]
        for field in _shown_job(job_id, env, check=False)
        if field.startswith("JobState=")
    ]


def test_a_sweep_array_runs_its_tasks_as_workers_of_one_study(slurm, project):
    def journal() -> optuna.storages.JournalStorage:
        backend = optuna.storages.journal.JournalFileBackend(str(project / "sweeps" / "array.journal"))
        return optuna.storages.JournalStorage(backend)

    _run_array(slurm, project, "array", journal)


def test_a_sweep_array_keeps_its_study_on_postgresql(slurm, project):
    # Both tasks start at once on a new database: each may find the other creating Optuna's tables.
    with postgres() as server:
        _run_array({**slurm, "STORAGE": server.url}, project, "array-pg", lambda: server.url)


def _run_array(env: dict, project: Path, name: str, storage) -> None:
    """A job array of two tasks, workers of the study ``name`` (4 trials) in ``storage()``."""
    shipped = yaml.safe_load((project / "configs" / "sweep" / "lr_dropout.yaml").read_text())
    sweep = {**shipped, "name": name, "trials": 4, "startup_trials": 2}
    (project / "configs" / "sweep" / f"{name}.yaml").write_text(yaml.safe_dump(sweep))
    job = _submit_array(project, env, name)

    def ended() -> bool:
        states = _array_states(job, env)
        return len(states) == 2 and not {"PENDING", "RUNNING", "COMPLETING"} & set(states)

    _wait_for(ended, "the array's two tasks", timeout=600)
    outputs = "".join(
        (project / "checkpoints" / f"slurm-{job}_{task}.out").read_text()[-3000:] for task in (0, 1)
    )
    assert _array_states(job, env) == ["COMPLETED", "COMPLETED"], outputs

    study = optuna.load_study(study_name=name, storage=storage())
    finished = study.get_trials(states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
    assert len(finished) == len(study.trials) == 4, outputs
    assert len({json.dumps(trial.params, sort_keys=True) for trial in finished}) == 4
    workers = {trial.user_attrs["worker"]["slurm"] for trial in finished}
    assert workers == {f"{job}_0", f"{job}_1"}, workers  # both tasks ran trials
    records = [json.loads(line) for line in (project / "experiments.jsonl").read_text().splitlines()]
    lines = {line["run_name"]: line for line in records if line["run_name"].startswith(f"{name}-")}
    assert sorted(lines) == sorted(trial.user_attrs["run_name"] for trial in finished)
    assert lines[study.best_trial.user_attrs["run_name"]]["best_value"] == study.best_value


def _submit_array(project: Path, env: dict, name: str) -> str:
    return _sbatch(
        project,
        env,
        *["sbatch", "--parsable", "--array=0-1", "--cpus-per-task=1", "--gpus-per-node=0"],
        *["scripts/slurm/sweep.sbatch", f"configs/sweep/{name}.yaml"],
        *["--", "--trainer.max_epochs=3", "--data.subset=400", "--trainer.enable_progress_bar=false"],
    )
