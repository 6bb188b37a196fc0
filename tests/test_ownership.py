"""The table of whose files are whose, in docs/updating.md and GUIDE.md, says what copier.yml does."""

import re
from fnmatch import fnmatch

import yaml
from conftest import ROOT

UPDATING = ROOT / "docs" / "updating.md"
HEADER = "| yours: once you edit one, an update never touches it |"
# The template's folders of code and tests (v0.17.0); the table must name them.
TEMPLATE_FOLDERS = ("framework/", "template/")
# The most lines of Python a project has outside src/<package>/framework/: the user's files and
# the package's __init__.py and __main__.py files.
OUTSIDE_FRAMEWORK_LINES = 600


def skip_if_exists(package: str) -> list[str]:
    """The user's files, from ``_skip_if_exists`` in copier.yml, as glob patterns inside a project."""
    config = yaml.safe_load((ROOT / "copier.yml").read_text())
    return [path.lstrip("/").replace("{{ package_name }}", package) for path in config["_skip_if_exists"]]


def as_entry(pattern: str) -> str:
    """How the table names a user pattern: ``configs/model/*.yaml`` is the folder ``configs/model/``."""
    return pattern.removesuffix("*.yaml")


def table_rows(text: str) -> list[str]:
    """The body rows of the ownership table in a Markdown text."""
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith(HEADER)))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def columns(rows: list[str]) -> tuple[set[str], set[str]]:
    """The paths named in the table's user column and in its template column."""
    yours, template = set(), set()
    for row in rows:
        left, right = row.strip("|").split(" | ")
        yours |= set(re.findall(r"`([^`]+)`", left))
        template |= set(re.findall(r"`([^`]+)`", right))
    return yours, template


def assert_agrees(yours: set[str], template: set[str], patterns: list[str]) -> None:
    assert sorted(yours ^ {as_entry(pattern) for pattern in patterns}) == [], "user column != copier.yml"
    for entry in template:
        assert not any(fnmatch(entry, pattern) for pattern in patterns), f"{entry} is the user's"
        if entry.endswith("/"):
            assert not any(pattern.startswith(entry) for pattern in patterns), f"{entry} holds user files"
    for name in TEMPLATE_FOLDERS:
        assert any(entry.endswith(f"/{name}") for entry in template), f"{name} not in the template column"


def test_the_updating_table_is_copier_ymls():
    yours, template = columns(table_rows(UPDATING.read_text()))
    assert_agrees(yours, template, skip_if_exists("<package>"))


def test_the_guides_table_is_a_copy_that_names_the_projects_files(generated):
    for key in ("loggers=wandb+csv", "task=regression,loggers=wandb+csv"):
        project = generated(key)
        package = next((project / "src").iterdir()).name
        rows = table_rows((project / "GUIDE.md").read_text())
        yours, template = columns(rows)
        present = [p for p in skip_if_exists(package) if any(project.glob(p.removesuffix("/")))]
        assert_agrees(yours, template, present)
        missing = [entry for entry in template if not (project / entry).exists()]
        assert missing == [], f"{key}: the template column names files the project does not have"
        if "regression" not in key:
            copy = [row.replace(f"src/{package}/", "src/<package>/") for row in rows]
            updating = [re.sub(r" \(or `[^`]*`\)", "", row) for row in table_rows(UPDATING.read_text())]
            assert copy == updating, "GUIDE.md's table is not docs/updating.md's"


def test_the_layout_page_shows_the_same_table():
    assert table_rows((ROOT / "docs" / "layout.md").read_text()) == table_rows(UPDATING.read_text())


def test_the_package_is_the_users_files_and_one_folder_of_the_templates(generated):
    for key in ("loggers=wandb+csv", "task=regression,loggers=wandb+csv"):
        project = generated(key)
        package = next((project / "src").iterdir())
        users = skip_if_exists(package.name)
        outside = [
            path
            for path in package.rglob("*.py")
            if "framework" not in path.relative_to(package).parts and "__pycache__" not in path.parts
        ]
        theirs = [
            str(path.relative_to(project))
            for path in outside
            if path.name not in ("__init__.py", "__main__.py")
            and not any(fnmatch(str(path.relative_to(project)), pattern) for pattern in users)
        ]
        assert theirs == [], f"{key}: template files outside src/{package.name}/framework/"
        lines = sum(len(path.read_text().splitlines()) for path in outside)
        assert lines <= OUTSIDE_FRAMEWORK_LINES, f"{key}: {lines} lines outside framework/"
        tests = project / "tests"
        top = sorted(path.name for path in tests.iterdir() if path.is_file())
        assert top == ["conftest.py", "test_models.py"], f"{key}: the top of tests/ holds {top}"
