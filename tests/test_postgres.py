"""A generated project's sweeps with their study on a real PostgreSQL server (tests/postgres.py).

Two workers on one study, on two "machines" (each in a UTS namespace of its own, so that each
records its own host name), one killed outright mid-trial: the other finds the trial by its missing
heartbeat, tries it again from its last.ckpt, and the study ends at its budget. The server going
away mid-sweep ends the worker in one line, and the sweep continues once it is back; a wrong
password or database is one line. Needs root for the namespaces (as `.ci/run` runs).
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
import sqlalchemy
import yaml
from conftest import copy_template, install
from postgres import PASSWORD, USER, postgres

pytestmark = pytest.mark.slow

# Six epochs of 400 samples: each trial trains several seconds after Python and Lightning start,
# so that a kill after its first checkpoint finds it training.
FIT_ARGS = ["--", "--trainer.max_epochs=6", "--data.subset=400"]
HEARTBEAT_S, GRACE_S = 1, 5
LIMIT_S = 600  # a worker's whole sweep; a hang fails the test


@pytest.fixture(scope="module")
def server():
    with postgres() as running:
        yield running


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    destination = copy_template(tmp_path_factory.mktemp("postgres-project") / "project", loggers=["csv"])
    install(destination)
    return destination


def _sweep_file(project: Path, name: str, trials: int) -> Path:
    shipped = yaml.safe_load((project / "configs" / "sweep" / "lr_dropout.yaml").read_text())
    sweep = {**shipped, "name": name, "trials": trials, "startup_trials": 2, "pruner": "none"}
    sweep |= {"heartbeat_interval": HEARTBEAT_S, "grace_period": GRACE_S}
    path = project / "configs" / "sweep" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def _start(project: Path, words: list[str], output: Path, host: str | None = None) -> subprocess.Popen:
    """scripts/sweep.py with ``words``, in a process group of its own; on ``host``, a machine of its
    own name (a UTS namespace)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env |= {"PYTHONPATH": str(project / "src"), "WANDB_SILENT": "true"}
    command = [sys.executable, "scripts/sweep.py", *words]
    if host:
        command = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh", *command]
    with output.open("w") as out:
        return subprocess.Popen(
            command, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _lose(process: subprocess.Popen) -> None:
    """End ``process`` and every process below it at once, as a machine that is lost: a warm
    trial runs in a process group of its own, below its worker's warm server. All are stopped
    first, so that none sees another end (a trial would save its last.ckpt on its server's end)."""
    below = psutil.Process(process.pid).children(recursive=True)
    for signum in (signal.SIGSTOP, signal.SIGKILL):
        for pid in [process.pid, *(child.pid for child in below)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
    process.wait()


def _wait(process: subprocess.Popen, limit_s: float = LIMIT_S) -> int:
    try:
        return process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


def _study(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=url)


def _fit_lines(project: Path, run: str) -> list[dict]:
    lines = [json.loads(line) for line in (project / "experiments.jsonl").read_text().splitlines()]
    return [line for line in lines if line["run_name"] == run and line["stage"] == "fit"]


def _trial_with_checkpoint(project: Path, url: str, name: str, host: str, limit_s: float = 300):
    """The trial that the worker on ``host`` runs, once its run has saved last.ckpt."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        trials = _study(url, name).get_trials() if name in optuna.get_all_study_names(url) else []
        for trial in (trial for trial in trials if trial.state == optuna.trial.TrialState.RUNNING):
            run = trial.user_attrs.get("run_name")
            on_host = trial.user_attrs.get("worker", {}).get("host") == host
            if on_host and run and (project / "checkpoints" / run / "last.ckpt").is_file():
                return trial
        time.sleep(0.2)
    pytest.fail(f"timed out after {limit_s} s waiting for a trial on {host} to save last.ckpt")


def test_a_worker_killed_on_another_machine_is_tried_again_from_its_heartbeat(server, project, tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare, for a host name of each worker's own")
    sweep = _sweep_file(project, "beat", trials=4)
    words = [str(sweep), "--storage", server.url, *FIT_ARGS]
    killed = _start(project, words, tmp_path / "node-a.log", host="node-a")
    time.sleep(3)  # node-a takes trial 0
    survivor = _start(project, words, tmp_path / "node-b.log", host="node-b")
    try:
        victim = _trial_with_checkpoint(project, server.url, "beat", "node-a")
        _lose(killed)  # the worker and its fit, as a lost machine would be
        killed_at = time.monotonic()
        assert _wait(survivor) == 0, (tmp_path / "node-b.log").read_text()[-3000:]
    finally:
        for process in (killed, survivor):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    output = (tmp_path / "node-b.log").read_text()
    print(f"node-b ended {time.monotonic() - killed_at:.0f} s after node-a was killed")

    study = _study(server.url, "beat")
    states = [trial.state for trial in study.trials]
    ended = [trial for trial in study.trials if trial.state == optuna.trial.TrialState.COMPLETE]
    assert len(ended) == 4 and states.count(optuna.trial.TrialState.FAIL) == 1, states
    assert study.trials[victim.number].state == optuna.trial.TrialState.FAIL
    (retried,) = [trial for trial in ended if trial.user_attrs.get("retry_of") == victim.number]
    assert retried.params == victim.params
    assert retried.user_attrs["run_name"] == victim.user_attrs["run_name"]
    assert retried.user_attrs["worker"]["host"] == "node-b"
    assert {trial.user_attrs["worker"]["host"] for trial in ended} == {"node-b"}, "node-a finished none"
    pid = victim.user_attrs["worker"]["pid"]
    lost = f"trial {victim.number}'s worker on node-a (pid {pid}) gave no heartbeat for {GRACE_S} s: "
    assert lost + "trying it again" in output
    assert f"[trial {retried.number}] {victim.user_attrs['run_name']} (resumed): " in output
    # The killed fit wrote no line; its resumed run's line holds both parts.
    (line,) = _fit_lines(project, victim.user_attrs["run_name"])
    assert line["status"] == "finished" and len(line["parts"]) == 2, line
    assert line["best_value"] == retried.value
    best = _fit_lines(project, study.best_trial.user_attrs["run_name"])[-1]
    assert best["best_value"] == study.best_value
    assert "Traceback" not in output
    # The password is printed nowhere, nor saved with the runs: the fits get the URL from their
    # environment, not their command line.
    assert PASSWORD not in output and f"{USER}:***@127.0.0.1" in output
    saved = [path for path in (project / "checkpoints").rglob("*") if path.is_file()]
    saved.append(project / "experiments.jsonl")
    assert saved and not [path for path in saved if PASSWORD.encode() in path.read_bytes()]


def test_the_server_going_away_ends_the_worker_in_one_line_and_the_sweep_continues(server, project, tmp_path):
    sweep = _sweep_file(project, "outage", trials=2)
    words = [str(sweep), "--storage", server.url, *FIT_ARGS]
    worker = _start(project, words, tmp_path / "worker.log")
    try:
        interrupted = _trial_with_checkpoint(project, server.url, "outage", os.uname().nodename)
        server.stop()
        status = _wait(worker, limit_s=120)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        if not server.running:
            server.start()
    output = (tmp_path / "worker.log").read_text()
    assert status == 1, output[-3000:]
    assert "Traceback" not in output, output[-5000:]
    last = output.strip().splitlines()[-1]
    assert re.fullmatch(
        r"error: the study's storage stopped answering \(.+\): "
        "run the same command again to continue the study",
        last,
    ), last
    assert "error: the sweep's storage stopped answering: " in output

    again = _start(project, words, tmp_path / "again.log")
    assert _wait(again) == 0, (tmp_path / "again.log").read_text()[-3000:]
    study = _study(server.url, "outage")
    assert sum(trial.state == optuna.trial.TrialState.COMPLETE for trial in study.trials) == 2
    run = interrupted.user_attrs["run_name"]
    assert f"{run} (resumed)" in (tmp_path / "again.log").read_text()


def test_workers_that_start_together_on_a_new_database_all_open_it(server, project):
    # Each creates Optuna's tables at the same moment; without trying again, most rounds lost one
    # or more workers to `duplicate key value violates unique constraint "pg_type_typname_nsp_index"`.
    opening = (
        "import sys; from project.framework.sweeps.spec import KEYS; "
        "from project.framework.sweeps.study import open_storage; "
        "open_storage(sys.argv[1], dict(KEYS)); print('opened')"
    )
    engine = sqlalchemy.create_engine(server.url, isolation_level="AUTOCOMMIT")
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    for round in range(3):
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text(f"CREATE DATABASE together{round}"))
        url = server.url.replace("/sweeps", f"/together{round}")
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", opening, url],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            for _ in range(4)
        ]
        try:
            said = [worker.communicate(timeout=120)[0] for worker in workers]
        finally:
            for worker in workers:
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait()
        assert [text.strip() for text in said] == ["opened"] * 4, said
    engine.dispose()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("s3cret@", "wrong@"), 'password authentication failed for user "sweeper"'),
        (("/sweeps", "/nothing"), 'database "nothing" does not exist'),
    ],
    ids=["password", "database"],
)
def test_a_wrong_password_or_database_is_one_line(server, project, tmp_path, change, message):
    sweep = _sweep_file(project, "wrong", trials=1)
    url = server.url.replace(*change)
    worker = _start(project, [str(sweep), "--storage", url, *FIT_ARGS], tmp_path / "worker.log")
    assert _wait(worker, limit_s=120) == 1
    output = (tmp_path / "worker.log").read_text().strip()
    assert len(output.splitlines()) == 1, output
    shown = sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)  # never the password
    assert output.startswith(f"error: {shown}: connection failed: ") and message in output, output


def test_a_password_given_as_a_query_parameter_is_used_and_printed_nowhere(server, project, tmp_path):
    sweep = _sweep_file(project, "query", trials=1)
    url = server.url.replace(f":{PASSWORD}@", "@") + f"?password={PASSWORD}"
    worker = _start(project, [str(sweep), "--storage", url, *FIT_ARGS], tmp_path / "worker.log")
    status = _wait(worker)
    output = (tmp_path / "worker.log").read_text()
    assert status == 0, output[-3000:]
    shown = url.replace(f"={PASSWORD}", "=***")
    assert f"Study query ({shown}): " in output, output[-3000:]
    assert PASSWORD not in output and "Traceback" not in output
    [run] = [trial.user_attrs["run_name"] for trial in _study(server.url, "query").trials]
    saved = [path for path in (project / "checkpoints" / run).rglob("*") if path.is_file()]
    assert saved and not [path for path in saved if PASSWORD.encode() in path.read_bytes()]


@pytest.mark.parametrize(
    ("url", "line"),
    [
        (
            "postgresql://{user}@127.0.0.1:{port}/sweeps?password=Wr0ngPass",
            "error: postgresql://{user}@127.0.0.1:{port}/sweeps?password=***: connection failed: ",
        ),
        (
            "postgresql://{user}:Hun@ter2@127.0.0.1:{port}/sweeps",
            "error: postgresql://{user}:***@127.0.0.1:{port}/sweeps: failed to resolve host '***@127.0.0.1'",
        ),
    ],
    ids=["query-password", "unescaped-at"],
)
def test_a_wrong_password_in_any_form_is_one_line_without_it(server, project, tmp_path, url, line):
    sweep = _sweep_file(project, "wrong", trials=1)
    url, line = (text.format(user=USER, port=server.port) for text in (url, line))
    worker = _start(project, [str(sweep), "--storage", url, *FIT_ARGS], tmp_path / "worker.log")
    assert _wait(worker, limit_s=120) == 1
    output = (tmp_path / "worker.log").read_text().strip()
    assert len(output.splitlines()) == 1 and output.startswith(line), output
    assert not [secret for secret in ("Wr0ngPass", "Hun", "ter2") if secret in output], output
