"""Copies of the template, generated once per answer set and shared by the tests that inspect them.

Every generated project is installed (without dependencies) into the one environment that runs
these tests, which already holds every package a project can depend on.
"""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import copier
import pytest

ROOT = Path(__file__).resolve().parents[1]

LOGGER_SETS = [
    [],
    ["wandb"],
    ["tensorboard"],
    ["csv"],
    ["wandb", "tensorboard"],
    ["wandb", "csv"],
    ["tensorboard", "csv"],
    ["wandb", "tensorboard", "csv"],
]
LICENSES = ["MIT", "Apache-2.0", "BSD-3-Clause", "none"]
PYTHON_VERSIONS = ["3.10", "3.11", "3.12", "3.13"]


def _answers(index: int, task: str, loggers: list[str]) -> dict:
    return {
        "project_name": f"Matrix Project {index}",
        "author_name": "Ada Lovelace",
        "author_email": "ada@example.com",
        "task": task,
        "loggers": loggers,
        "license": LICENSES[index % 4],
        "python_version": PYTHON_VERSIONS[(index + index // 4) % 4],
    }


# Every logger combination for classification, with licence and Python version rotated so each
# value appears; then regression, with the default loggers answer (wandb) and with TensorBoard and CSV.
MATRIX = {
    f"loggers={'+'.join(loggers) or 'none'}": _answers(index, "classification", loggers)
    for index, loggers in enumerate(LOGGER_SETS)
}
REGRESSION_LOGGER_SETS = [["wandb"], ["tensorboard", "csv"]]
MATRIX |= {
    f"task=regression,loggers={'+'.join(loggers)}": _answers(index, "regression", loggers)
    for index, loggers in enumerate(REGRESSION_LOGGER_SETS, start=len(LOGGER_SETS))
}


def copy_template(destination: Path, **answers) -> Path:
    """Copy this working tree of the template as `copier copy --defaults --vcs-ref=HEAD` would."""
    copier.run_copy(
        str(ROOT), str(destination), data=answers, defaults=True, quiet=True, unsafe=False, vcs_ref="HEAD"
    )
    return destination


@pytest.fixture(scope="session")
def generated(tmp_path_factory):
    """The project generated for a MATRIX key, made once per session."""
    projects: dict[str, Path] = {}

    def generate(key: str) -> Path:
        if key not in projects:
            projects[key] = copy_template(tmp_path_factory.mktemp("matrix") / "project", **MATRIX[key])
        return projects[key]

    return generate


_installed: tuple[Path, bytes] | None = None  # the project installed last, and its pyproject.toml


def install(project: Path) -> None:
    """Install a generated project, without dependencies, into the environment running the tests.

    Skipped when it is the project this test run installed last, with the same pyproject.toml
    (an editable install serves the project's current code); a pip install takes seconds.
    """
    global _installed
    installing = (project.resolve(), (project / "pyproject.toml").read_bytes())
    if installing == _installed:
        return
    _installed = None  # until pip has succeeded
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(project)],
        check=True,
        timeout=600,
    )
    _installed = installing


def run_python(project: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run this environment's Python in a generated project's directory, outside this pytest run.

    After ``timeout`` seconds the process and every process it started (DDP workers, data loader
    workers) are killed and ``subprocess.TimeoutExpired`` is raised: a hang fails the test.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["WANDB_SILENT"] = "true"
    with subprocess.Popen(
        [sys.executable, *args],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, so that killing it reaches its children
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:  # the timeout, or an interrupted test run
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
