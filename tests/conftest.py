"""Copies of the template, generated once per answer set and shared by the tests that inspect them.

One environment runs these tests and every generated project: it already holds every package a
project can depend on. A project's own code is found through PYTHONPATH (see run_python), so that
copies of projects with the same package name can run at once, in pytest-xdist's workers.
"""

import contextlib
import fcntl
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
# value appears; then regression, with the default loggers answer (wandb and CSV) and with
# TensorBoard and CSV.
MATRIX = {
    f"loggers={'+'.join(loggers) or 'none'}": _answers(index, "classification", loggers)
    for index, loggers in enumerate(LOGGER_SETS)
}
REGRESSION_LOGGER_SETS = [["wandb", "csv"], ["tensorboard", "csv"]]
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
    """Install a generated project, without dependencies, into the environment running the tests:
    ``pip install -e .`` as its README says, and for what runs outside run_python (a Slurm job).

    Skipped when it is the project this process installed last, with the same pyproject.toml
    (an editable install serves the project's current code); a pip install takes seconds. One pip
    at a time changes the environment, whichever xdist worker asks.
    """
    global _installed
    installing = (project.resolve(), (project / "pyproject.toml").read_bytes())
    if installing == _installed:
        return
    _installed = None  # until pip has succeeded
    with open(Path(sys.prefix) / ".tests-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(project)],
            check=True,
            timeout=600,
        )
    _installed = installing


def run_python(project: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run this environment's Python in a generated project's directory, outside this pytest run.

    The project's ``src`` comes first on PYTHONPATH, so its package is this copy's code whatever
    else is installed under the same name. After ``timeout`` seconds the process and every process
    it started (DDP workers, data loader workers) are killed and ``subprocess.TimeoutExpired`` is
    raised: a hang fails the test.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project.resolve() / "src"), env.get("PYTHONPATH")]))
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


# `make test` runs these tests in two pytest-xdist workers (`-n 2 --dist loadgroup`). A module's
# tests run in one worker, where its fixtures are made once (a Slurm cluster, trained projects, a
# built site); test_generated.py's tests, each a generated project's suite or part of it, are
# shared out one by one. The slow work goes first, longest first, so both workers end together.
SLOW_FIRST = (
    "test_update.py",
    "test_generated.py",
    "test_faults.py",
    "test_slurm.py",
    "test_recipes.py",
    "test_release.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name != "test_generated.py" and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))

    def rank(item: pytest.Item) -> tuple[bool, int]:
        name = item.path.name
        return (item.get_closest_marker("slow") is None, (*SLOW_FIRST, name).index(name))

    items.sort(key=rank)


def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    # pytest-xdist marks a test's group by a suffix of its node id; where that has no effect
    # (pytest 9.2, pytest-xdist issue 1386) the groups are silently shared out test by test, and
    # each worker makes the module's fixtures again. Say so rather than run twice as long.
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid.rpartition("]")[2]]
    ungrouped = [nodeid for nodeid in ungrouped if not nodeid.startswith("tests/test_generated.py")]
    if node.config.getvalue("dist") == "loadgroup" and ungrouped:
        pytest.exit(f"pytest-xdist did not group {ungrouped[0]}: see requirements-dev.txt", returncode=4)
