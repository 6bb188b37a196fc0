"""`copier copy --defaults` from the command line derives the names from the destination.

The default config's training to 95% test accuracy is tested on what a user copies, the newest
release, in test_release.py."""

import subprocess
import sys

import pytest
from conftest import ROOT


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
    return destination


def test_defaults_derive_the_names_from_the_destination(default_project):
    answers = (default_project / ".copier-answers.yml").read_text()
    assert "project_name: my-project" in answers
    assert "package_name: my_project" in answers
    assert (default_project / "src" / "my_project" / "framework/cli.py").is_file()
