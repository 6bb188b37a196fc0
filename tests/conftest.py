"""Copies of the template, generated once per answer set and shared by the tests that inspect them.

Every generated project is installed (without dependencies) into the one environment that runs
these tests, which already holds every package a project can depend on.
"""

import os
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

# Every logger combination, with licence and Python version rotated so each value appears.
MATRIX = {
    f"loggers={'+'.join(loggers) or 'none'}": {
        "project_name": f"Matrix Project {index}",
        "author_name": "Ada Lovelace",
        "author_email": "ada@example.com",
        "loggers": loggers,
        "license": LICENSES[index % 4],
        "python_version": PYTHON_VERSIONS[(index + index // 4) % 4],
    }
    for index, loggers in enumerate(LOGGER_SETS)
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


def install(project: Path) -> None:
    """Install a generated project, without dependencies, into the environment running the tests."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(project)],
        check=True,
    )


def run_python(project: Path, *args: str) -> subprocess.CompletedProcess:
    """Run this environment's Python in a generated project's directory, outside this pytest run."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["WANDB_SILENT"] = "true"
    return subprocess.run([sys.executable, *args], cwd=project, capture_output=True, text=True, env=env)
