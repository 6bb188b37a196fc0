"""Copier's questions: every one explained, invalid answers refused with a clear message."""

import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, copy_template

QUESTIONS = yaml.safe_load((ROOT / "copier.yml").read_text())
VALID = {"project_name": "Digits", "author_name": "Ada Lovelace", "author_email": "ada@example.com"}


def test_every_asked_question_has_help():
    asked = {name: spec for name, spec in QUESTIONS.items() if not name.startswith("_")}
    assert {"project_name", "package_name", "description", "author_name", "author_email"} <= set(asked)
    assert {"python_version", "license", "loggers"} <= set(asked)
    for name, spec in asked.items():
        assert spec.get("help") or spec.get("when") is False, name


def test_nothing_needs_trust_except_a_migration_that_fires():
    assert {"_tasks", "_jinja_extensions"}.isdisjoint(QUESTIONS)
    # A migration without a version would run, and ask for --trust, on every update.
    assert all("version" in migration for migration in QUESTIONS.get("_migrations", []))
    assert QUESTIONS["_min_copier_version"] and QUESTIONS["_answers_file"] == ".copier-answers.yml"


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ({"package_name": "import"}, "is a Python keyword"),
        ({"package_name": "json"}, "would shadow the module"),
        ({"package_name": "torch"}, "would shadow the module"),
        ({"package_name": "lightning"}, "would shadow the module"),
        ({"package_name": "My-Package"}, "is not a valid package name"),
        ({"package_name": "2fast"}, "is not a valid package name"),
        ({"project_name": "   "}, "project name must not be empty"),
        ({"project_name": "{{ 7*7 }}"}, "project name needs a letter"),
        ({"project_name": "!!!"}, "project name needs a letter"),
        ({"author_email": "ada.example.com"}, "is not an e-mail address"),
        ({"author_email": "ada@localhost"}, "is not an e-mail address"),
        ({"author_name": ""}, "author name must not be empty"),
        ({"description": "two\nlines"}, "must be a single line"),
        ({"description": 'a "quoted" word'}, "must not contain backslashes or double quotes"),
        ({"python_version": "2.7"}, "Invalid choice for 'python_version'"),
        ({"license": "GPL-3.0"}, "Invalid choice for 'license'"),
        ({"loggers": ["mlflow"]}, "Invalid choice for 'loggers'"),
    ],
)
def test_invalid_answers_are_refused(tmp_path, answers, message):
    destination = tmp_path / "project"
    with pytest.raises(ValueError, match=message):
        copy_template(destination, **{**VALID, **answers})
    assert not destination.exists() or not any(destination.iterdir())


def test_package_name_is_derived_from_the_project_name(tmp_path):
    project = copy_template(tmp_path / "p", **{**VALID, "project_name": "3D Cell-Segmentation (v2)"})
    assert (project / "src" / "d_cell_segmentation_v2").is_dir()


def test_the_copy_ends_with_where_the_users_code_goes_and_the_readmes_commands(tmp_path):
    destination = tmp_path / "weather"
    copy = [sys.executable, "-m", "copier", "copy", "--defaults", "--vcs-ref=HEAD"]
    result = subprocess.run(
        [*copy, "--data", "project_name=Weather", str(ROOT), str(destination)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stderr[result.stderr.index(f"Your project is in {destination}. Next:") :]
    readme = (destination / "README.md").read_text()
    commands = [line.split("#")[0].strip() for line in said.splitlines() if line.startswith("  ")]
    assert commands[0] == f"cd {destination}"
    for command in commands[1:]:  # each one is the README's, as a user reads it there
        assert command in readme, command
    assert "src/weather/models/" in said and "configs/project.yaml" in said and "analysis/" in said
    assert "src/weather/framework/ and tests/template/ are the" in said
