"""What a user gets: the newest release, copied as the README says, trains and passes its tests.

The template is cloned, tagged with `make tags`, and copied with `copier copy --defaults` and no
`--vcs-ref`, so Copier takes the newest tag, as it does for every user. The project's commands are
the README's, run in this environment (which holds every package a project needs) instead of
`pip install -e ".[dev]"`; then the user trains data of their own, and the project's tests still pass.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import ROOT, run_python
from release import released, unreleased_problem
from sklearn.datasets import load_wine

# `make tags` makes annotated tags, which need a tagger; nothing of a `make test` running this
# reaches the inner make.
ENV = {
    **{key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")},
    "GIT_COMMITTER_NAME": "release test",
    "GIT_COMMITTER_EMAIL": "release-test@example.com",
}
COMMAND_TIMEOUT = 600  # seconds; a command that hangs fails the test


def _run(cwd: Path, *command: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    assert done.returncode == 0, f"{command}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.release
def test_the_template_is_the_newest_release():
    # Changes to what projects contain reach users only in a release (docs/releasing.md).
    assert unreleased_problem() is None


@pytest.mark.slow
def test_a_user_copy_is_the_newest_release_and_trains_and_passes_its_tests(tmp_path):
    template = tmp_path / "copier-lightning"
    _run(tmp_path, "git", "clone", "--quiet", ROOT.as_uri(), str(template))
    _run(template, "make", "tags")
    copier = Path(sys.executable).with_name("copier")
    _run(tmp_path, str(copier), "copy", "--quiet", "--defaults", str(template), "my-project")

    project = tmp_path / "my-project"
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["_commit"] == released()[-1][0]

    def command(*args: str) -> subprocess.CompletedProcess:
        done = run_python(project, *args, timeout=COMMAND_TIMEOUT)
        assert done.returncode == 0, f"{args}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    command("-m", "my_project", "fit", "--run_name", "first")
    (best,) = (project / "checkpoints" / "first").glob("best-*.ckpt")
    command("-m", "my_project", "test", "--ckpt_path", str(best.relative_to(project)))
    fit, test = (json.loads(line) for line in (project / "experiments.jsonl").read_text().splitlines())
    assert fit["stage"] == "fit" and fit["best_checkpoint"] == str(best.resolve())
    assert test["test"]["test/acc"] >= 0.95

    # Then the user points configs/project.yaml at data of their own (scikit-learn's wine, as a CSV
    # file) and another network width. The tests train tests/template/reference.yaml's model and data, so
    # their numbers still hold; the one test that trains project.yaml's choice trains the wine.
    wine = load_wine()
    rows = np.column_stack([wine.data, wine.target])
    header = ",".join([*wine.feature_names, "label"])
    np.savetxt(project / "data" / "wine.csv", rows, delimiter=",", header=header, comments="", fmt="%g")
    config = yaml.safe_load((project / "configs" / "project.yaml").read_text())
    config["model"]["init_args"]["network"]["init_args"]["hidden_sizes"] = [64]
    data = {"path": "data/wine.csv", "label_column": "label", "batch_size": 32}
    config["data"] = {"class_path": "my_project.data.FileDataModule", "init_args": data}
    (project / "configs" / "project.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    output = command("-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA").stdout
    assert (
        "PASSED tests/template/test_smoke.py::test_the_projects_own_model_and_data_train_and_test" in output
    )
    # Tests whose precondition this machine lacks are skipped (CI runs as root: no read-only directories).
    passed_only = r"\d+ passed(, \d+ skipped)?, \d+ deselected(, \d+ warnings?)? in .+"
    summary = output.splitlines()[-1]
    assert re.fullmatch(passed_only, summary), summary
