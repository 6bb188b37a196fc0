"""`copier update` from earlier releases to the newest, on a project with real user edits.

The template's history is rebuilt in a temporary repository: each release listed in CHANGELOG.md
as the tree of its commit, tagged. A working tree that differs from the newest release is the next
release, committed on top and tagged with the version of CHANGELOG.md's unreleased section. A
project is copied at earlier releases (UPDATE_FROM), edited as a user would, committed, and
updated as the user updates, to the newest tag (`copier update --defaults --trust`). Another is
trained at earlier releases (TRAINED_AT) before it is edited and updated, and the new code tests,
predicts with, resumes and starts a new run from the checkpoints the old code wrote.
"""

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import copier
import pytest
import torch
import yaml
from conftest import ROOT, run_python
from copier.errors import UnsafeTemplateError
from pathspec import GitIgnoreSpec
from release import changed_since, released, releases, version

# Identity for the commits these tests make in generated projects (and Copier's own).
for _variable, _value in {"GIT_AUTHOR_NAME": "CI", "GIT_COMMITTER_NAME": "CI"}.items():
    os.environ.setdefault(_variable, _value)
for _variable in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
    os.environ.setdefault(_variable, "ci@example.com")

ANSWERS = {
    "project_name": "Upgraded",
    "author_name": "Ada Lovelace",
    "author_email": "ada@example.com",
    "loggers": ["csv"],
}
CONFLICT = re.compile(r"^(<{7}|>{7}|={7})( |$)", re.MULTILINE)


def git(cwd: Path, *args: str) -> str:
    command = ["git", *args]
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True, timeout=120).stdout


def _replace_tree(repo: Path, files: dict[str, bytes]) -> None:
    for path in repo.iterdir():
        if path.name != ".git":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for name, content in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(content)


def _tree_at(commit: str) -> dict[str, bytes]:
    command = ["git", "archive", commit]
    archive = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers() if member.isfile()}


def _working_tree() -> dict[str, bytes]:
    names = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return {name: (ROOT / name).read_bytes() for name in names if name and (ROOT / name).is_file()}


RELEASED = released()
UNRELEASED = [tag for tag, commit in releases() if not commit]
# The working tree is the newest release, or the next one: what every update goes to.
CURRENT = not changed_since(RELEASED[-1][1])
EARLIER = RELEASED[:-1] if CURRENT else RELEASED
NEWEST = RELEASED[-1][0] if CURRENT else (UNRELEASED or ["(untagged)"])[0]


def migration_spans(tags: list[str]) -> list[list[str]]:
    """``tags`` grouped by the migrations an update from each runs: those of copier.yml's versions
    after it. The releases of a span take the same steps to the newest; only what the three-way
    merge merges differs."""
    migrations = yaml.safe_load((ROOT / "copier.yml").read_text())["_migrations"]
    versions = {version(migration["version"]) for migration in migrations}
    spans: dict[int, list[str]] = {}
    for tag in tags:
        spans.setdefault(sum(after > version(tag) for after in versions), []).append(tag)
    return list(spans.values())


# The releases that first wrote each layout of checkpoint (``layout``), oldest first, as
# UPDATE_FROM=all finds them (the old_run fixture fails on a release that wrote another).
LAYOUTS = ["v0.1.0", "v0.2.0", "v0.3.0", "v0.13.0", "v0.16.0", "v0.17.0", "v0.19.0"]
# The releases the update tests update from (UPDATE_FROM): by default the first and the last of
# each span; and at which they train (TRAINED_AT): those of LAYOUTS and the newest earlier one,
# which may have written a new layout. UPDATE_FROM=all: every earlier release, for both.
UPDATE_FROM = TRAINED_AT = [tag for tag, _ in EARLIER]
if os.environ.get("UPDATE_FROM", "spans") != "all":
    UPDATE_FROM = [tag for span in migration_spans(UPDATE_FROM) for tag in dict.fromkeys((span[0], span[-1]))]
    TRAINED_AT = [tag for tag in TRAINED_AT if tag in LAYOUTS or tag == TRAINED_AT[-1]]


@pytest.fixture(scope="module")
def template_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("history") / "template"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch=main")
    git(repo, "config", "user.email", "ci@example.com")
    git(repo, "config", "user.name", "CI")
    # --force: the template's own .gitignore (for generated projects) must not drop template files.
    for tag, commit in RELEASED:
        _replace_tree(repo, _tree_at(commit))
        git(repo, "add", "--all", "--force")
        git(repo, "commit", "--quiet", "--allow-empty", "-m", tag)
        git(repo, "tag", tag)
    if not CURRENT:
        if not UNRELEASED:
            pytest.fail(f"the template changed since {RELEASED[-1][0]}; CHANGELOG.md names no next release")
        _replace_tree(repo, _working_tree())
        git(repo, "add", "--all", "--force")
        git(repo, "commit", "--quiet", "--allow-empty", "-m", "the next release")
        git(repo, "tag", UNRELEASED[0])
    return repo


PACKAGE = "upgraded"
MLP = f"src/{PACKAGE}/models/mlp.py"
USER_OWNED = [
    "/README.md",
    MLP,
    f"src/{PACKAGE}/models/convnet.py",
    f"src/{PACKAGE}/models/example.py",
    f"src/{PACKAGE}/data/digits.py",
    f"src/{PACKAGE}/data/diabetes.py",
    "tests/test_models.py",
    "analysis/README.md",
    "configs/project.yaml",
    "configs/experiment/*.yaml",
    "configs/model/*.yaml",
    "configs/data/digits.yaml",
    "configs/data/diabetes.yaml",
]
CNN = '''"""A small convolutional network for the 8x8 digit images."""

from torch import Tensor, nn


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10, channels: int = 16) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, channels, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(channels * 16, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
'''
CNN_EXPERIMENT = f"""# Our CNN instead of the MLP.
model:
  init_args:
    network:
      class_path: {PACKAGE}.models.cnn.SmallCNN
      init_args:
        channels: 8
"""
NOTES = "\nOur lab trains on the digits first, then on the slide scans.\n"
# The image pipeline, new in v0.3.0: the template's data module, config and script, and the user's
# network and model config (written by the update, since the project has none).
IMAGE_PIPELINE = [
    f"src/{PACKAGE}/framework/data/images.py",
    f"src/{PACKAGE}/models/convnet.py",
    "configs/data/images.yaml",
    "configs/model/cnn.yaml",
    "scripts/digits_to_images.py",
]


def copy_at(repo: Path, ref: str, destination: Path, **answers) -> Path:
    copier.run_copy(
        str(repo), str(destination), data={**ANSWERS, **answers}, defaults=True, quiet=True, vcs_ref=ref
    )
    git(destination, "init", "--quiet", "--initial-branch=main")
    commit_all(destination, "copied from the template")
    return destination


def commit_all(project: Path, message: str) -> None:
    git(project, "add", "--all")
    git(project, "commit", "--quiet", "--allow-empty", "-m", message)


def update(project: Path, **options) -> None:
    """`copier update --defaults` as a user runs it: to the newest tag, conflicts inline."""
    copier.run_update(str(project), defaults=True, overwrite=True, quiet=True, conflict="inline", **options)


# The template's Classifier, whose metrics the user edits: in models/classifier.py before v0.17.0;
# since, the module is in framework/models/ and its metrics in framework/models/parts.py, beside
# the other parts of a training step. An update across the move keeps the user's edited
# classifier as ``<name>.edited``.
MOVE = "v0.17.0"
CLASSIFIER = f"src/{PACKAGE}/framework/models/classifier.py"
OLD_CLASSIFIER = f"src/{PACKAGE}/models/classifier.py"
KEPT_CLASSIFIER = f"{OLD_CLASSIFIER}.edited"
METRICS = f"src/{PACKAGE}/framework/models/parts.py"


def predates_the_move(release: str) -> bool:
    return version(release) < version(MOVE)


def template_metrics(release: str) -> str:
    """The template's file that holds the Classifier's metrics at ``release``."""
    home = OLD_CLASSIFIER if predates_the_move(release) else METRICS
    return "template/" + home.replace(f"src/{PACKAGE}/", "src/{{package_name}}/")


# A metric the user adds to the template's Classifier, after a line that every release has.
F1 = '"f1": MulticlassF1Score(num_classes, average="macro"'
USER_METRIC = '"balanced_acc": MulticlassAccuracy(num_classes, average="macro"),'


def with_user_metric(text: str, metric: str = USER_METRIC) -> str:
    """``text`` with ``metric`` on a line of its own after the F1 metric's, indented alike."""
    f1_line = next(line for line in text.splitlines(keepends=True) if F1 in line)
    indent = f1_line[: len(f1_line) - len(f1_line.lstrip())]
    return text.replace(f1_line, f1_line + indent + metric + "\n", 1)


# The model and data settings: in configs/default.yaml up to v0.5.0, in configs/project.yaml since.
DEFAULT_CONFIG, PROJECT_CONFIG = "configs/default.yaml", "configs/project.yaml"
# Notes only: a change to the model would refuse resuming a run trained before the edit.
USER_MODEL_NOTE, USER_SPLIT_NOTE = "    # our network: the lab's\n", "    # our split: the paper's\n"


def with_user_settings(config: str) -> str:
    """``config`` with a note of the user's in the model settings and one in the data settings."""
    assert config.count("    network:\n") == 1 and config.count("    split_seed: 0\n") == 1
    config = config.replace("    network:\n", USER_MODEL_NOTE + "    network:\n")
    return config.replace("    split_seed: 0\n", USER_SPLIT_NOTE + "    split_seed: 0\n")


def edit_like_a_user(project: Path) -> dict[str, str]:
    """Make the edits a user makes in the first weeks; return what each edited file must contain.

    A new model and experiment, edits to the user's own model (``mlp.py``), experiment config and
    README, notes in the model and data settings (in the template's ``default.yaml`` before v0.6.0, in
    the user's ``project.yaml`` since), and to two of the template's files: a dependency in
    ``pyproject.toml`` and a metric in ``models/classifier.py``, which v0.2.0 and v0.3.0 rewrote
    around it and v0.17.0 moved to ``framework/models/classifier.py``.
    """
    settings = project / (PROJECT_CONFIG if (project / PROJECT_CONFIG).is_file() else DEFAULT_CONFIG)
    settings.write_text(with_user_settings(settings.read_text()))
    (experiment,) = (project / "configs" / "experiment").glob("*.yaml")  # its name depends on the release
    experiment.write_text(experiment.read_text().replace("max_epochs: 60", "max_epochs: 45"))
    package = project / "src" / PACKAGE
    (package / "models" / "cnn.py").write_text(CNN)
    (project / "configs" / "experiment" / "cnn.yaml").write_text(CNN_EXPERIMENT)
    mlp = project / MLP
    mlp.write_text(mlp.read_text().replace("dropout: float = 0.1", "dropout: float = 0.25"))
    pyproject = project / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace('    "rich>=13",\n', '    "rich>=13",\n    "pyyaml>=6",\n')
    )
    readme = project / "README.md"
    readme.write_text(readme.read_text() + NOTES)
    metrics = project / (OLD_CLASSIFIER if (project / OLD_CLASSIFIER).is_file() else METRICS)
    metrics.write_text(with_user_metric(metrics.read_text()))
    commit_all(project, "our model, experiment, dependency, notes and metric")
    return {
        f"src/{PACKAGE}/models/cnn.py": CNN,
        "configs/experiment/cnn.yaml": CNN_EXPERIMENT,
        "configs/experiment/large_batch.yaml": "max_epochs: 45",  # renamed from long_cosine.yaml
        MLP: "dropout: float = 0.25",
        "pyproject.toml": '"pyyaml>=6",',
        "README.md": NOTES,
        METRICS: "balanced_acc",  # carried over to the new home by resolve_like_a_user
        PROJECT_CONFIG: USER_SPLIT_NOTE,  # and USER_MODEL_NOTE, checked with the rest below
    }


def side(text: str, kept: str) -> str:
    """``text`` with each inline conflict replaced by one of its sides: ``before`` (the user's
    version) or ``after`` (the template's new version)."""
    lines, keep = [], True
    for line in text.splitlines(keepends=True):
        if line.startswith("<<<<<<< before updating"):
            keep = kept == "before"
        elif line.startswith("=======") and line.strip() == "=======":
            keep = kept == "after"
        elif line.startswith(">>>>>>> after updating"):
            keep = True
        elif keep:
            lines.append(line)
    return "".join(lines)


def rewrote_the_classifier(repo: Path, release: str) -> bool:
    """Whether the template changed the classifier's lines around the user's metric between
    ``release`` and the newest: an update then conflicts there. A change elsewhere in the file
    merges beside the user's metric, as ``git merge-file`` merges it. Across the move, nothing
    merges: the update keeps the user's classifier aside, whole."""
    if predates_the_move(release):
        return False
    old, new = (git(repo, "show", f"{ref}:{template_metrics(ref)}") for ref in (release, NEWEST))
    with tempfile.TemporaryDirectory() as directory:
        paths = [Path(directory) / name for name in ("mine", "base", "theirs")]
        for path, text in zip(paths, (with_user_metric(old), old, new), strict=True):
            path.write_text(text)
        merge = subprocess.run(["git", "merge-file", "-q", *map(str, paths)], timeout=60)
    assert merge.returncode >= 0, f"git merge-file failed on {release}'s classifier"
    return merge.returncode > 0


class Left(NamedTuple):
    """The classifier as the update left it: at its new home, and the user's edited one that an
    update across the move kept aside (None when there is none)."""

    classifier: str
    kept: str | None


def resolve_like_a_user(project: Path) -> Left:
    """Resolve the classifier's conflict, or carry over the edit the update kept aside, as GUIDE.md
    and the update's note say: the template's new version with the user's metric added to it
    again, and the ``.edited`` file deleted."""
    classifier, kept = project / METRICS, project / KEPT_CLASSIFIER
    left = Left(classifier.read_text(), kept.read_text() if kept.is_file() else None)
    if left.kept is None and not CONFLICT.search(left.classifier):
        return left
    template = side(left.classifier, "after")
    metric = USER_METRIC.replace('average="macro")', 'average="macro", validate_args=False)')
    classifier.write_text(with_user_metric(template, metric))
    kept.unlink(missing_ok=True)
    return left


def files(project: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(project)): path.read_bytes()
        for path in project.rglob("*")
        if path.is_file() and ".git" not in path.relative_to(project).parts
    }


def differing(project: Path, fresh: dict[str, bytes]) -> list[str]:
    """The files of the project that a fresh copy lacks, has alone, or has with other contents."""
    mine = files(project)
    return sorted(name for name in mine.keys() | fresh.keys() if mine.get(name) != fresh.get(name))


def conflicted(project: Path) -> list[str]:
    """The files with conflict markers, and the ``.rej`` files."""
    return sorted(
        name
        for name, content in files(project).items()
        if name.endswith(".rej") or CONFLICT.search(content.decode(errors="replace"))
    )


def assert_clean_merge(project: Path) -> None:
    assert conflicted(project) == []


def test_changelog_lists_the_releases_with_upgrade_notes():
    tags = [tag for tag, _ in releases()]
    assert tags[:3] == ["v0.1.0", "v0.2.0", "v0.3.0"]
    assert len(UNRELEASED) <= 1 and (not UNRELEASED or UNRELEASED[0] == tags[-1])
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for tag in tags:
        notes = changelog.split(f"## {tag} ", 1)[1].split("\n## ", 1)[0]
        assert "Upgrade notes:" in notes, tag


class Updated(NamedTuple):
    project: Path
    expected: dict[str, str]  # what each file the user edited must contain
    conflicted: list[str]  # the files with conflict markers that the update left
    left: Left  # the classifier as the update left it
    rewritten: bool  # whether the template changed the lines around the user metric since the release
    moved: bool  # whether the release predates the move, so the update kept the user's classifier aside


@pytest.fixture(scope="module", params=UPDATE_FROM)
def updated(request, template_repo, tmp_path_factory) -> Updated:
    """A project copied at each release of UPDATE_FROM, edited, updated to the newest and resolved."""
    project = copy_at(template_repo, request.param, tmp_path_factory.mktemp("updated") / "upgraded")
    expected = edit_like_a_user(project)
    update(project, unsafe=True)
    left = conflicted(project)
    rewritten = rewrote_the_classifier(template_repo, request.param)
    moved = predates_the_move(request.param)
    return Updated(project, expected, left, resolve_like_a_user(project), rewritten, moved)


def test_update_conflicts_only_where_the_template_and_the_user_changed_the_same_lines(updated):
    # Not in a file of the user's, nor in pyproject.toml, where the template adds lines away from
    # the user's: only in the classifier, where the template rewrote the metrics around the user's.
    # Across the move, nowhere: the user's classifier is kept aside, whole, beside the new one.
    if updated.moved:
        assert updated.conflicted == []
        edits = git(updated.project, "rev-list", "--reverse", "HEAD").split()[1]  # after the copy
        assert updated.left.kept == git(updated.project, "show", f"{edits}:{OLD_CLASSIFIER}")
        assert USER_METRIC in updated.left.kept and "balanced_acc" not in updated.left.classifier
        return
    assert updated.left.kept is None
    if not updated.rewritten:
        assert updated.conflicted == [] and USER_METRIC in updated.left.classifier
        return
    assert updated.conflicted == [METRICS]
    assert updated.left.classifier.count("<<<<<<< before updating") == 1
    users, templates = updated.left.classifier.split("\n=======\n")
    assert USER_METRIC in users.split("<<<<<<< before updating\n")[1]
    assert "balanced_acc" not in templates.split(">>>>>>> after updating")[0]


def test_the_template_side_of_the_conflict_is_the_new_release(updated, template_repo, tmp_path):
    # Around the conflict, the update brought the template's new version of every line.
    fresh = copy_at(template_repo, "HEAD", tmp_path / "upgraded")
    new = (fresh / METRICS).read_text()
    if updated.moved:  # the new home is the template's; the user's edit is kept aside
        assert updated.left.classifier == new
        return
    assert side(updated.left.classifier, "after") == (new if updated.rewritten else with_user_metric(new))
    mine = git(updated.project, "show", f"HEAD:{METRICS}")  # the user's edited version
    assert USER_METRIC in side(updated.left.classifier, "before") and USER_METRIC in mine


def test_update_keeps_every_user_edit(updated):
    for name, content in updated.expected.items():
        assert content in (updated.project / name).read_text(), name
    # The image pipeline is added beside the user's own models/cnn.py, which is kept.
    assert [name for name in IMAGE_PIPELINE if not (updated.project / name).is_file()] == []
    assert_clean_merge(updated.project)


def test_the_tests_know_which_files_are_the_users():
    patterns = yaml.safe_load((ROOT / "copier.yml").read_text())["_skip_if_exists"]
    assert [pattern.replace("{{ package_name }}", PACKAGE) for pattern in patterns] == USER_OWNED


# What each pattern of _skip_if_exists must match in a fresh copy, by task, and nothing else:
# a pattern without a slash matches at every depth, as in .gitignore.
OWNED_FILES = {
    "classification": {
        "/README.md": ["README.md"],
        MLP: [MLP],
        f"src/{PACKAGE}/models/convnet.py": [f"src/{PACKAGE}/models/convnet.py"],
        f"src/{PACKAGE}/models/example.py": [f"src/{PACKAGE}/models/example.py"],
        f"src/{PACKAGE}/data/digits.py": [f"src/{PACKAGE}/data/digits.py"],
        "tests/test_models.py": ["tests/test_models.py"],
        "analysis/README.md": ["analysis/README.md"],
        "configs/project.yaml": ["configs/project.yaml"],
        "configs/experiment/*.yaml": ["configs/experiment/large_batch.yaml"],
        "configs/model/*.yaml": [
            "configs/model/backbone.yaml",
            "configs/model/classifier.yaml",
            "configs/model/cnn.yaml",
            "configs/model/example.yaml",
            "configs/model/mlp_wide.yaml",
            "configs/model/regressor.yaml",
            "configs/model/text_pretrained.yaml",
            "configs/model/text_transformer.yaml",
        ],
        "configs/data/digits.yaml": ["configs/data/digits.yaml"],
    },
    "regression": {
        f"src/{PACKAGE}/data/diabetes.py": [f"src/{PACKAGE}/data/diabetes.py"],
        "configs/data/diabetes.yaml": ["configs/data/diabetes.yaml"],
    },
}


@pytest.mark.parametrize("task", OWNED_FILES)
def test_each_user_file_pattern_matches_only_the_files_it_means(template_repo, tmp_path, task):
    project = files(copy_at(template_repo, "HEAD", tmp_path / "upgraded", task=task))
    for pattern in USER_OWNED:
        matched = [name for name in sorted(project) if GitIgnoreSpec.from_lines([pattern]).match_file(name)]
        expected = OWNED_FILES[task].get(pattern, OWNED_FILES["classification"].get(pattern, []))
        if task == "regression" and "digits" in pattern:
            expected = []
        assert matched == expected, pattern
    assert "data/README.md" in project and "configs/logger/README.md" in project  # the template's


def test_updated_files_equal_a_fresh_copy_but_for_the_users_edits(updated, template_repo, tmp_path):
    # The user's own files included: those the user never edited are refreshed by a migration.
    fresh = files(copy_at(template_repo, "HEAD", tmp_path / "upgraded"))
    assert differing(updated.project, fresh) == sorted(updated.expected)


def test_the_users_model_and_data_settings_are_in_their_own_file_after_the_update(
    updated, template_repo, tmp_path
):
    # Before v0.6.0 they were in the template's default.yaml; a migration moved them to the user's
    # project.yaml, into the new release's version of it.
    fresh = copy_at(template_repo, "HEAD", tmp_path / "upgraded")
    mine = (updated.project / PROJECT_CONFIG).read_text()
    assert mine == with_user_settings((fresh / PROJECT_CONFIG).read_text())
    assert (updated.project / DEFAULT_CONFIG).read_text() == (fresh / DEFAULT_CONFIG).read_text()


def test_a_user_file_the_user_edited_keeps_exactly_the_users_version(updated):
    edits = git(updated.project, "rev-list", "--reverse", "HEAD").split()[1]  # after the copy
    for name in (MLP, "README.md"):
        assert (updated.project / name).read_text() == git(updated.project, "show", f"{edits}:{name}"), name


@pytest.mark.parametrize("release", UPDATE_FROM)
def test_a_user_file_the_user_never_edited_is_refreshed(template_repo, tmp_path, release):
    project = copy_at(template_repo, release, tmp_path / "upgraded")
    before = files(project)
    update(project, unsafe=True)
    assert_clean_merge(project)
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == NEWEST
    fresh = files(copy_at(template_repo, "HEAD", tmp_path / "fresh" / "upgraded"))
    assert differing(project, fresh) == []
    if release == EARLIER[0][0]:  # the template has changed these since: the test checks something
        assert before[MLP] != fresh[MLP] and before["README.md"] != fresh["README.md"]
    if version(release) < (0, 3, 0):  # the update adds the image pipeline, as a fresh copy has it
        assert [name for name in IMAGE_PIPELINE if name in before] == []
        assert [name for name in IMAGE_PIPELINE if name not in files(project)] == []


def test_the_first_release_answers_are_kept(updated):
    answers = yaml.safe_load((updated.project / ".copier-answers.yml").read_text())
    assert {key: answers[key] for key in ANSWERS} == ANSWERS
    assert answers["_commit"] == NEWEST


def test_updating_twice_changes_nothing_the_second_time(updated):
    commit_all(updated.project, "updated")
    update(updated.project)
    assert git(updated.project, "status", "--porcelain") == ""


# The generated test files that build and train the project's networks (the MLP the user edited,
# the image CNN beside the user's own cnn.py), export them and lint the project.
USER_MODEL_TEST_FILES = ("smoke", "training", "config", "images", "export", "lint")


@pytest.mark.slow
@pytest.mark.xdist_group("update-suite")  # needs none of the module's trained projects
def test_updated_project_passes_its_tests_and_trains_the_user_model(template_repo, tmp_path):
    # An update from each release of UPDATE_FROM gives the same files (see above), and those equal
    # a fresh copy's but for the user's edits, whose own suite test_generated.py runs: here the
    # fast tests that build, train, evaluate, export and lint the user's networks, on one update.
    project = copy_at(template_repo, EARLIER[-1][0], tmp_path / "upgraded")
    edit_like_a_user(project)
    update(project, unsafe=True)
    resolve_like_a_user(project)
    user_model_tests = [f"tests/template/test_{name}.py" for name in USER_MODEL_TEST_FILES]
    pytest_args = ["-q", "-p", "no:cacheprovider", "-m", "not slow", *user_model_tests]
    result = run_python(project, "-m", "pytest", *pytest_args)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    smoke = project / "configs" / "debug" / "smoke.yaml"
    fit = run_python(
        project,
        "-m",
        PACKAGE,
        "fit",
        "--config=configs/experiment/cnn.yaml",
        f"--config={smoke}",
        "--run_name=cnn",
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert (project / "checkpoints" / "cnn" / "last.ckpt").is_file()
    # The metric the user added to the template's classifier is logged.
    (metrics,) = (project / "checkpoints" / "cnn").rglob("metrics.csv")
    assert "val/balanced_acc" in metrics.read_text().splitlines()[0].split(",")
    # The pretrained backbone, new in v0.13.0, fine-tunes on images in the updated project: a
    # first run's weights are the second's starting point, its head frozen for the first epoch.
    assert run_python(project, "scripts/digits_to_images.py").returncode == 0
    backbone = [
        "--config=configs/data/images.yaml",
        "--config=configs/model/backbone.yaml",
        f"--config={smoke}",
    ]
    tiny = ["--model.init_args.network.init_args.name=test_resnet", "--data.init_args.image_size=32"]
    first = run_python(
        project,
        "-m",
        PACKAGE,
        "fit",
        *backbone,
        *tiny,
        "--run_name=start",
        "--model.init_args.network.init_args.weights=null",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    weights = project / "checkpoints" / "start" / "last.ckpt"
    tuned = run_python(
        project,
        "-m",
        PACKAGE,
        "fit",
        *backbone,
        *tiny,
        "--run_name=tuned",
        f"--model.init_args.network.init_args.weights={weights}",
    )
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    assert "Backbone test_resnet" in tuned.stdout
    assert (
        "the network's own interpolation bilinear, mean [0.5, 0.5, 0.5], std [0.5, 0.5, 0.5]" in tuned.stdout
    )
    start, end = (
        read_checkpoint(path)["state_dict"]
        for path in (weights, project / "checkpoints" / "tuned" / "last.ckpt")
    )
    assert not torch.equal(start["network.model.conv1.0.weight"], end["network.model.conv1.0.weight"])


# The run trained at each release of TRAINED_AT, as its smoke config sets it (also spelled out here):
# 64 samples of each split in batches of 16, so 4 training steps an epoch.
OLD_RUN = "first"
SUBSET, BATCH_SIZE, OLD_EPOCHS = 64, 16, 2
COMMAND_TIMEOUT = 300  # seconds; a command that hangs fails its test


class OldRun(NamedTuple):
    release: str
    project: Path  # updated to this version since the run
    best: Path  # the run's best checkpoint, as the old release wrote it
    saved_step: int  # the global step of the run's last.ckpt


def project_cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m upgraded ARGS`` in the project's directory; it must succeed."""
    result = run_python(project, "-m", PACKAGE, *args, timeout=COMMAND_TIMEOUT)
    assert result.returncode == 0, f"{args}:\n{result.stdout[-2000:]}\n{result.stderr[-5000:]}"
    return result


def records(project: Path) -> list[dict]:
    return [json.loads(line) for line in (project / "experiments.jsonl").read_text().splitlines()]


def read_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def layout(value: Any, options: bool = False) -> Any:
    """What a checkpoint holds, whatever the run's numbers, times and paths: every key, nested (a
    checkpoint's path as a key is ``<path>``); the texts and truth values of the hyper-parameters
    (class paths, options); the type of every other value; a tensor's dtype and shape."""
    if isinstance(value, dict):
        keys = {key: "<path>" if str(key).endswith(".ckpt") else str(key) for key in value}
        return {
            keys[key]: layout(item, options or key in HYPER_PARAMETERS)
            for key, item in sorted(value.items(), key=lambda pair: keys[pair[0]])
        }
    if isinstance(value, list | tuple):
        return [layout(item, options) for item in value]
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape))
    kept = options and (isinstance(value, str | bool) or value is None)
    return value if kept else type(value).__name__


HYPER_PARAMETERS = ("hyper_parameters", "datamodule_hyper_parameters")
# The layout of each release's checkpoints (best, last) whose tests ran, and the release.
TESTED_LAYOUTS: dict[str, str] = {}


@pytest.fixture(scope="module", params=TRAINED_AT)
def old_run(request, template_repo, tmp_path_factory) -> OldRun:
    """A project copied at each release of TRAINED_AT and trained there, with that release's code,
    then edited as a user would, updated to the newest release, and its conflict resolved.

    A release whose checkpoints hold exactly what an earlier release's do (``layout``) is skipped:
    the new code reads them as it reads that release's, which the tests below have shown.
    """
    project = copy_at(template_repo, request.param, tmp_path_factory.mktemp("trained") / "upgraded")
    project_cli(
        project,
        "fit",
        "--config=configs/debug/smoke.yaml",
        f"--data.init_args.subset={SUBSET}",
        f"--data.init_args.batch_size={BATCH_SIZE}",
        f"--trainer.max_epochs={OLD_EPOCHS}",
        f"--run_name={OLD_RUN}",
    )
    run_dir = project / "checkpoints" / OLD_RUN
    (best,) = run_dir.glob("best-*.ckpt")
    saved_step = read_checkpoint(run_dir / "last.ckpt")["global_step"]
    assert saved_step > 0
    held = json.dumps([layout(read_checkpoint(path)) for path in (best, run_dir / "last.ckpt")])
    if held in TESTED_LAYOUTS:
        pytest.skip(f"its checkpoints hold what {TESTED_LAYOUTS[held]}'s do")
    assert request.param in LAYOUTS, f"{request.param} wrote a new layout of checkpoint: add it to LAYOUTS"
    TESTED_LAYOUTS[held] = request.param
    commit_all(project, "the record of our first run")
    edit_like_a_user(project)
    update(project, unsafe=True)
    assert conflicted(project) == ([METRICS] if rewrote_the_classifier(template_repo, request.param) else [])
    resolve_like_a_user(project)
    commit_all(project, f"updated to {NEWEST}")
    return OldRun(request.param, project, best, saved_step)


# For each release the tests below run in this order: resuming may replace the old best
# checkpoint with a better one, so the tests that need the old one come first.
@pytest.mark.slow
def test_old_best_and_last_checkpoints_test_and_predict_with_the_new_code(old_run):
    for checkpoint in (old_run.best, old_run.best.with_name("last.ckpt")):
        project_cli(old_run.project, "test", f"--ckpt_path={checkpoint}")
        tested = [record for record in records(old_run.project) if record.get("stage") == "test"][-1]
        assert tested["run_name"] == OLD_RUN and tested["checkpoint"] == str(checkpoint.resolve())
        accuracy = tested["test"]["test/acc"]
        assert 0 <= accuracy <= 1 and 0 <= tested["test"]["test/f1"] <= 1

        run_dir = old_run.project / "checkpoints" / OLD_RUN
        before = set(run_dir.glob("predict-*/predictions.csv"))
        project_cli(old_run.project, "predict", f"--ckpt_path={checkpoint}")
        (predictions,) = set(run_dir.glob("predict-*/predictions.csv")) - before
        with predictions.open(newline="") as file:
            rows = list(csv.DictReader(file))
        # The data settings come from the old checkpoint: its test split, cut to SUBSET samples.
        assert len(rows) == SUBSET
        correct = sum(row["predicted"] == row["label"] for row in rows)
        assert correct / len(rows) == pytest.approx(accuracy, abs=1e-6), checkpoint.name


@pytest.mark.slow
def test_new_run_starts_from_the_old_best_weights(old_run):
    # A learning rate too small to move a float32 weight: the new run ends with the old weights.
    project_cli(
        old_run.project,
        "fit",
        "--config=configs/debug/smoke.yaml",
        f"--weights={old_run.best}",
        "--model.init_args.lr=1e-10",
        "--trainer.max_epochs=1",
        "--run_name=new",
    )
    new = read_checkpoint(old_run.project / "checkpoints" / "new" / "last.ckpt")
    assert new["global_step"] == SUBSET // BATCH_SIZE  # a run of its own, not a continuation
    old = read_checkpoint(old_run.best)["state_dict"]
    # Weights and biases; BatchNorm's running statistics move whatever the learning rate.
    learned = [name for name, value in old.items() if value.is_floating_point() and "running_" not in name]
    assert learned
    for name in learned:
        torch.testing.assert_close(new["state_dict"][name], old[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.slow
def test_old_last_checkpoint_resumes_with_the_new_code(old_run):
    more = OLD_EPOCHS + 2
    # The smoke config of the earlier releases set the model's warm-up; the run resumes with it.
    warmup_steps = read_checkpoint(old_run.best)["hyper_parameters"]["warmup_steps"]
    project_cli(
        old_run.project,
        "fit",
        "--config=configs/debug/smoke.yaml",
        f"--model.init_args.warmup_steps={warmup_steps}",
        "--ckpt_path=last",
        f"--run_name={OLD_RUN}",
        f"--trainer.max_epochs={more}",
    )
    resumed = read_checkpoint(old_run.project / "checkpoints" / OLD_RUN / "last.ckpt")
    assert resumed["global_step"] > old_run.saved_step
    assert resumed["epoch"] == more - 1
    fits = [r for r in records(old_run.project) if r.get("stage") == "fit" and r["run_name"] == OLD_RUN]
    assert fits[-1]["steps"] == resumed["global_step"]
    # The run keeps the metric it started with: val/acc before v0.3.0, val/loss since.
    kept = "val/acc" if version(old_run.release) < version("v0.3.0") else "val/loss"
    assert fits[-1]["monitor"] == kept
    assert 0 <= fits[-1]["best_value"] <= (1 if kept == "val/acc" else math.inf)
    assert Path(fits[-1]["best_checkpoint"]).is_file()


def test_the_rename_migration_needs_trust_and_keeps_the_users_experiment(template_repo, tmp_path):
    project = copy_at(template_repo, "v0.1.0", tmp_path / "upgraded")
    old = project / "configs" / "experiment" / "long_cosine.yaml"
    old.write_text(old.read_text().replace("max_epochs: 60", "max_epochs: 45"))
    commit_all(project, "a longer schedule")

    with pytest.raises(UnsafeTemplateError, match="migrations"):
        update(project)
    assert git(project, "status", "--porcelain") == ""

    update(project, unsafe=True)
    assert not old.exists()
    assert "max_epochs: 45" in (project / "configs" / "experiment" / "large_batch.yaml").read_text()
    assert_clean_merge(project)


@pytest.mark.skipif(
    version(NEWEST) < version("v0.5.0") or "v0.4.0" not in dict(EARLIER), reason="v0.5.0 moved the modules"
)
def test_an_edited_module_that_the_update_moves_is_kept_beside_its_new_home(template_repo, tmp_path, capfd):
    project = copy_at(template_repo, "v0.4.0", tmp_path / "upgraded")
    package = project / "src" / PACKAGE
    edited = package / "utils" / "runs.py"
    ours = "# Our runs are kept for 30 days.\n"
    edited.write_text(edited.read_text() + ours)
    commit_all(project, "a note on our runs")
    capfd.readouterr()

    update(project, unsafe=True)
    # Copier deletes every module the template moved; the migration kept the edited one.
    for moved in ("runs", "record", "summary", "interrupts", "checkpointing", "sweep_trial"):
        assert not (package / "utils" / f"{moved}.py").exists(), moved
    assert (package / "utils" / "runs.py.edited").read_text().endswith(ours)
    assert sorted(path.name for path in package.rglob("*.edited")) == ["runs.py.edited"]
    # v0.17.0 moved it again, into framework/: the note names where it is now.
    new_home = package / "framework" / "runs" / "directory.py"
    assert new_home.is_file() and ours not in new_home.read_text()
    assert (
        f"note: src/{PACKAGE}/utils/runs.py moved to src/{PACKAGE}/framework/runs/directory.py in v0.5.0 "
        f"and v0.17.0; your edited version is kept as src/{PACKAGE}/utils/runs.py.edited: carry your "
        "changes over to the new file, then delete it"
    ) in capfd.readouterr().err
    assert_clean_merge(project)


@pytest.mark.skipif(
    predates_the_move(NEWEST) or "v0.16.0" not in dict(EARLIER),
    reason="v0.17.0 moved the template's code into framework/ and its tests into tests/template/",
)
def test_edited_modules_that_the_update_moves_into_the_framework_are_kept_beside_their_new_homes(
    template_repo, tmp_path, capfd
):
    project = copy_at(template_repo, "v0.16.0", tmp_path / "upgraded")
    classifier = project / OLD_CLASSIFIER
    classifier.write_text(with_user_metric(classifier.read_text()))
    checkpoints = project / "src" / PACKAGE / "runs" / "checkpoints.py"
    ours = "# Our checkpoints are kept for 30 days.\n"
    checkpoints.write_text(checkpoints.read_text() + ours)
    commit_all(project, "a metric, and a note on our checkpoints")
    edited = {
        name: (project / name).read_text() for name in (OLD_CLASSIFIER, f"src/{PACKAGE}/runs/checkpoints.py")
    }
    capfd.readouterr()

    update(project, unsafe=True)
    notes = [line for line in capfd.readouterr().err.splitlines() if line.startswith("note: ")]
    assert notes == [
        f"note: src/{PACKAGE}/runs/checkpoints.py moved to src/{PACKAGE}/framework/runs/checkpoints.py in "
        f"v0.17.0; your edited version is kept as src/{PACKAGE}/runs/checkpoints.py.edited: carry your "
        "changes over to the new file, then delete it",
        f"note: {OLD_CLASSIFIER} moved to {CLASSIFIER} in v0.17.0; your edited version is kept as "
        f"{KEPT_CLASSIFIER}: carry your changes over to the new file, then delete it",
    ]
    for name, text in edited.items():
        assert (project / f"{name}.edited").read_text() == text, name
    # Every other file is a fresh copy's: the moved modules and tests the user never edited are
    # gone from their old homes, and the new homes hold the template's new versions.
    fresh = files(copy_at(template_repo, "HEAD", tmp_path / "fresh" / "upgraded"))
    assert differing(project, fresh) == sorted(f"{name}.edited" for name in edited)
    assert_clean_merge(project)


def test_changing_an_answer_adds_and_removes_exactly_the_logger_files(template_repo, tmp_path):
    project = copy_at(template_repo, "HEAD", tmp_path / "upgraded")
    for loggers in (["wandb", "tensorboard"], ["csv"]):
        update(project, data={"loggers": loggers})
        commit_all(project, f"loggers: {loggers}")
        fresh = copy_at(template_repo, "HEAD", tmp_path / "-".join(loggers) / "upgraded", loggers=loggers)
        assert files(project) == files(fresh)
        dependencies = (project / "pyproject.toml").read_text()
        assert ('"wandb>=' in dependencies) == ("wandb" in loggers)
        assert ('"tensorboard>=' in dependencies) == ("tensorboard" in loggers)


def test_pre_commit_refuses_conflict_markers_and_rejects(template_repo, tmp_path):
    project = copy_at(template_repo, "HEAD", tmp_path / "upgraded")
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert hooks["check-merge-conflict"]["args"] == ["--assume-in-merge"]

    conflicted = project / "conflicted.py"
    conflicted.write_text("<<<<<<< before updating\nx = 1\n=======\nx = 2\n>>>>>>> after updating\n")
    check = subprocess.run(
        [sys.executable, "-m", "pre_commit_hooks.check_merge_conflict", "--assume-in-merge", str(conflicted)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 1 and "Merge conflict string" in check.stdout

    local = [repo for repo in config["repos"] if repo["repo"] == "local"]
    (project / "local-hooks.yaml").write_text(yaml.safe_dump({"repos": local}))
    (project / "pyproject.toml.rej").write_text("@@ a rejected hunk @@\n")
    git(project, "add", "--all")
    hook = subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--config", "local-hooks.yaml", "--all-files"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert hook.returncode == 1 and "pyproject.toml.rej" in hook.stdout


TEXTS = "v0.19.0"  # the first release with texts
TEXT_CONFIGS = ["--config=configs/data/text.yaml", "--config=configs/model/text_transformer.yaml"]


def predicted(run_dir: Path, before: set[Path]) -> list[dict[str, str]]:
    """The rows of the one predictions.csv in ``run_dir`` that is not in ``before``."""
    (predictions,) = set(run_dir.glob("predict-*/predictions.csv")) - before
    with predictions.open(newline="") as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_a_text_model_of_the_first_release_with_texts_tests_predicts_and_exports_with_the_new_code(
    template_repo, tmp_path
):
    # Its tokenizer is in its checkpoint: the new code encodes the texts as the old one did, so its
    # test metrics and predictions are the old code's, and export.py (new since) takes the model.
    project = copy_at(template_repo, TEXTS, tmp_path / "texts")
    words = {"food": ["bread", "soup", "oven"], "music": ["song", "drum", "piano"]}
    rows = [
        [f"a {words[label][n % 3]} and the {words[label][(n + 1) % 3]} today", label]
        for n in range(60)
        for label in words
    ]
    with (project / "data" / "text.csv").open("w", newline="") as file:
        csv.writer(file).writerows([["text", "label"], *rows])
    project_cli(project, "fit", *TEXT_CONFIGS, "--trainer.max_epochs=3", "--run_name=texts")
    run_dir = project / "checkpoints" / "texts"
    (best,) = run_dir.glob("best-*.ckpt")

    def tested_and_predicted() -> tuple[dict[str, float], list[dict[str, str]]]:
        project_cli(project, "test", f"--ckpt_path={best}")
        before = set(run_dir.glob("predict-*/predictions.csv"))
        project_cli(project, "predict", f"--ckpt_path={best}")
        return [r for r in records(project) if r.get("stage") == "test"][-1]["test"], predicted(
            run_dir, before
        )

    old_metrics, old_predictions = tested_and_predicted()
    commit_all(project, "the first run on texts")
    update(project, unsafe=True)
    assert conflicted(project) == []
    new_metrics, new_predictions = tested_and_predicted()
    assert new_metrics == pytest.approx(old_metrics, abs=1e-6)
    assert len(new_predictions) == len(old_predictions) > 0
    for new, old in zip(new_predictions, old_predictions, strict=True):
        assert new.keys() == old.keys() and new["predicted"] == old["predicted"]
        assert {key: float(new[key]) for key in new if key.startswith("prob_")} == pytest.approx(
            {key: float(old[key]) for key in old if key.startswith("prob_")}, abs=1e-6
        )
    exported = run_python(
        project, "scripts/export.py", f"--ckpt_path={best}", "--formats", "onnx", timeout=COMMAND_TIMEOUT
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    (metadata,) = run_dir.glob("export-*/metadata.json")
    assert json.loads(metadata.read_text())["input"]["tokenizer"] == json.loads(
        read_checkpoint(best)["preprocessing"]["tokenizer"]
    )
