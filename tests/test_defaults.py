"""`copier copy --defaults` from the command line, then the README's main job on the result."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, install, run_python


@pytest.fixture(scope="module")
def default_project(tmp_path_factory):
    destination = tmp_path_factory.mktemp("defaults") / "my-project"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "copier",
            "copy",
            "--quiet",
            "--defaults",
            "--vcs-ref=HEAD",
            ROOT,
            destination,
        ],
        check=True,
        timeout=300,
    )
    install(destination)
    return destination


def test_defaults_derive_the_names_from_the_destination(default_project):
    answers = (default_project / ".copier-answers.yml").read_text()
    assert "project_name: my-project" in answers
    assert "package_name: my_project" in answers
    assert (default_project / "src" / "my_project" / "cli.py").is_file()


@pytest.mark.slow
def test_default_config_reaches_95_percent_test_accuracy(default_project):
    fit = run_python(default_project, "-m", "my_project", "fit", "--run_name=main")
    assert fit.returncode == 0, fit.stderr[-3000:]
    [best] = (default_project / "checkpoints" / "main").glob("best-epoch=*.ckpt")
    test = run_python(default_project, "-m", "my_project", "test", f"--ckpt_path={best}")
    assert test.returncode == 0, test.stderr[-3000:]

    fit_line, test_line = (
        json.loads(line) for line in (default_project / "experiments.jsonl").read_text().splitlines()
    )
    assert fit_line["best_checkpoint"] == str(best)
    assert test_line["test"]["test/acc"] >= 0.95
    print(f"default run: test/acc={test_line['test']['test/acc']}, training {fit_line['wall_time_s']} s")
