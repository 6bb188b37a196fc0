"""Every answer combination gives a complete, clean project whose own tests pass."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from conftest import MATRIX, ROOT, install, run_python
from packaging.requirements import Requirement

KEYS = list(MATRIX)
JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}|\{\{|\{%")
LOGGER_CLASSES = {"wandb": "WandbLogger", "tensorboard": "TensorBoardLogger", "csv": "CSVLogger"}
LOGGER_PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard"}


def _files(project):
    return [path for path in project.rglob("*") if path.is_file() and ".git" not in path.parts]


def _dependencies(project) -> list[Requirement]:
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    specs = pyproject["dependencies"] + pyproject["optional-dependencies"]["dev"]
    return [Requirement(spec) for spec in specs]


@pytest.mark.parametrize("key", KEYS)
def test_no_jinja_is_left(generated, key):
    project = generated(key)
    leftovers = [
        str(path.relative_to(project))
        for path in _files(project)
        if JINJA.search(str(path.relative_to(project))) or JINJA.search(path.read_text())
    ]
    assert leftovers == []
    assert not list(project.rglob("*.jinja"))


@pytest.mark.parametrize("key", KEYS)
def test_ruff_is_clean(generated, key):
    project = generated(key)
    for command in (["check"], ["format", "--check"]):
        ruff = [sys.executable, "-m", "ruff", *command, "--no-cache", "."]
        result = subprocess.run(ruff, cwd=project, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("key", KEYS)
def test_layout(generated, key):
    project = generated(key)
    package = project / "src" / MATRIX[key]["project_name"].lower().replace(" ", "_")
    for path in [
        "configs/default.yaml",
        "configs/project.yaml",
        "data/README.md",
        "checkpoints/.gitkeep",
        "scripts/train.py",
        "scripts/evaluate.py",
        "scripts/predict.py",
        "tests/template/test_smoke.py",
        "README.md",
        "GUIDE.md",
        ".github/workflows/ci.yml",
        "pyproject.toml",
        "environment.yml",
        ".gitignore",
        ".pre-commit-config.yaml",
        ".copier-answers.yml",
    ]:
        assert (project / path).is_file(), path
    for path in [
        "framework/cli.py",
        "__main__.py",
        "framework/models/classifier.py",
        "framework/models/regressor.py",
        "framework/runs/record.py",
    ]:
        assert (package / path).is_file(), path
    # The bundled dataset of the task, and not the other one.
    dataset, other = ("diabetes", "digits") if MATRIX[key]["task"] == "regression" else ("digits", "diabetes")
    for path in [package / "data" / f"{dataset}.py", project / "configs" / "data" / f"{dataset}.yaml"]:
        assert path.is_file(), path
    assert not list(project.rglob(f"{other}.*"))
    environment = yaml.safe_load((project / "environment.yml").read_text())
    assert f"python={MATRIX[key]['python_version']}" in environment["dependencies"]


@pytest.mark.parametrize("key", KEYS)
def test_only_chosen_loggers_leave_files_and_dependencies(generated, key):
    project, chosen = generated(key), MATRIX[key]["loggers"]
    assert sorted(path.stem for path in (project / "configs" / "logger").glob("*.yaml")) == sorted(chosen)
    logger = yaml.safe_load((project / "configs" / "default.yaml").read_text())["trainer"]["logger"]
    configured = [entry["class_path"].rsplit(".", 1)[-1] for entry in logger] if logger else []
    assert configured == [LOGGER_CLASSES[name] for name in chosen]
    names = {requirement.name for requirement in _dependencies(project)}
    for logger_name, package in LOGGER_PACKAGES.items():
        assert (package in names) == (logger_name in chosen), package
    guide = (project / "GUIDE.md").read_text()
    assert ("wandb sync" in guide) == ("wandb" in chosen)


@pytest.mark.parametrize("key", KEYS)
def test_the_task_chooses_model_data_and_monitor(generated, key):
    project = generated(key)
    config, own = (
        yaml.safe_load((project / "configs" / name).read_text()) for name in ("default.yaml", "project.yaml")
    )
    assert {"model", "data"} & config.keys() == set()  # the user's choice, in the user's file
    chosen = [own["model"]["class_path"], own["data"]["class_path"], config["checkpoint"]]
    names = [name.rsplit(".", 1)[-1] for name in chosen[:2]]
    if MATRIX[key]["task"] == "regression":
        assert names == ["Regressor", "DiabetesDataModule"]
        assert chosen[2]["monitor"] == "val/rmse" and "mode" not in chosen[2]  # from its name
    else:
        assert names == ["Classifier", "DigitsDataModule"]
        assert chosen[2]["monitor"] == "val/loss" and "mode" not in chosen[2]  # from its name
    file_data = yaml.safe_load((project / "configs" / "data" / "file.yaml").read_text())["data"]["init_args"]
    assert file_data["task"] == MATRIX[key]["task"]


@pytest.mark.parametrize("key", KEYS)
def test_licence(generated, key):
    project, licence = generated(key), MATRIX[key]["license"]
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    if licence == "none":
        assert not (project / "LICENSE").exists() and "license" not in pyproject
        return
    text = (project / "LICENSE").read_text()
    assert pyproject["license"] == licence
    expected = {"MIT": "MIT License", "Apache-2.0": "Apache License", "BSD-3-Clause": "BSD 3-Clause License"}
    assert expected[licence] in text
    assert licence == "Apache-2.0" or "Ada Lovelace" in text


@pytest.mark.parametrize("key", KEYS)
def test_answers_file_records_the_answers_only(generated, key):
    answers = yaml.safe_load((generated(key) / ".copier-answers.yml").read_text())
    for question, value in MATRIX[key].items():
        assert answers[question] == value
    assert "reserved_package_names" not in answers


@pytest.mark.parametrize("key", KEYS)
def test_declared_dependencies_are_met_by_this_environment(generated, key):
    # torch is installed first (the CPU build); the project's ranges must accept it as it is.
    for requirement in _dependencies(generated(key)):
        version = metadata.version(requirement.name)
        assert requirement.specifier.contains(version, prereleases=True), f"{requirement} vs {version}"


def _collected(project, *args: str) -> list[str]:
    result = run_python(project, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_a_plain_pytest_runs_the_smoke_suite_and_full_runs_every_test(generated, tmp_path):
    project = shutil.copytree(generated("loggers=wandb+csv"), tmp_path / "project")
    plain, full = _collected(project), _collected(project, "--full")
    assert plain == _collected(project, "-m", "smoke")
    assert "tests/template/test_smoke.py::test_fit_validate_resume_test_predict" in plain
    assert not [test for test in plain if "test_user_path" in test or "test_ddp" in test]
    assert set(plain) < set(full) and any("test_user_path" in test for test in full)
    # Naming a file runs all of it, smoke or not.
    assert _collected(project, "tests/template/test_ddp.py") == [
        test for test in full if "test_ddp.py" in test
    ]


# Which of a generated project's tests run, by answer set (each part is one test here, so that
# pytest-xdist's workers share them; each selection in a part is one pytest command):
# - classification with every logger: the whole suite, slow tests (resume, DDP, images, scripts,
#   sweeps, your own data) and the user's path (the default config, loggers on) included, in four
#   parts by file; the last part takes every file the others do not name;
# - regression: every test of the files whose model, metrics, monitored metric, data or reports
#   differ by task, slow ones included (the user's path with DDP and a mid-epoch resume, exact
#   resume, sweeps and the record among them), and the fast image tests (the image module
#   classifies in every project); the machinery both tasks share (DDP signals and hangs, memory,
#   tooling, exact resume with image workers) runs once, in the classification parts;
# - no logger: the fast tests of the files whose code or outcome depends on the loggers chosen;
#   in a regression project with the default loggers, those of its test report. The default
#   answer (wandb and CSV) runs its smoke suite in test_release.py, on what a user copies;
#   TensorBoard and CSV, alone or together, run in the regression project and beside wandb in the
#   full suite; a single logger other than wandb takes no path of its own in the project's code
#   (one entry of trainer.logger).
# The other answer sets are generated and checked above.
FULL = "loggers=wandb+tensorboard+csv"
FULL_PARTS = {"ddp+user_path": ("ddp", "user_path"), "images+training": ("images", "training")}
FULL_PARTS |= {"own_data+resume+sweep+scripts": ("own_data", "resume", "sweep", "scripts")}
FULL_PARTS |= {"backbones": ("backbone", "backbone_uses", "finetuning"), "multinode": ("multinode",)}
FULL_PARTS |= {"streaming": ("streaming",)}
FULL_PARTS |= {"texts": ("text", "text_serving", "text_pretrained", "text_guarantees")}
# The kit for a module of one's own, the terminal's output, the data modules and warm starts.
FULL_PARTS |= {
    "checks+outputs+data": (
        "module_checks",
        "outputs",
        "example_module",
        "data",
        "outside_data",
        "warm_trials",
        "own_module",
        "cross_validation",
    )
}
TASK_PARTS = {
    "user_path+resume+sweep+scripts+own_data": ("user_path", "resume", "sweep", "scripts", "own_data"),
    "files": ("refused_inputs", "training", "reports", "report_script", "config", "data", "errors", "export"),
}
TASK_PARTS["files"] += ("smoke", "lint", "loggers", "best_checkpoint", "serve", "outside_data", "guide")
TASK_PARTS["files"] += ("own_module", "cross_validation")  # a module of your own, and folds
TASK_PARTS["files"] += ("example_module",)  # models/example.py, a classifier or a regressor by task
# Tests of those files whose subject is the same in both tasks: torch.compile, DDP launched by
# Lightning's other two launchers (the ddp_cpu.yaml preset runs in both), the signals and save
# points of a resume other than a SIGKILL mid-epoch (which runs in both, on the user's path and not),
# the sweep's two workers, its stops (3 failures, SIGTERM), a fit ending with its killed worker and
# the shipped sweep of 8 trials killed and continued, with its pruning, report and dashboard (about
# 140 s; the sweep reads its metric and direction from the sweep file, and a regression project's
# one-trial sweep, killed and resumed in --runs_dir, checks its metric), --runs_dir given as two
# words rather than one, and what predict, the exports and indicator inputs do with missing values
# (the shared preprocessing; the refusal, drop and impute at fit run in both).
ONCE = (
    "test_training.py::test_compiled_network_trains_and_saves_plain_weight_names",
    "test_user_path.py::test_ddp_on_two_cpu_processes[ddp]",
    "test_user_path.py::test_ddp_on_two_cpu_processes[ddp_spawn]",
    "test_user_path.py::test_a_run_interrupted_mid_epoch_resumes_to_the_same_weights[SIGKILL-0-11-8]",
    "test_user_path.py::test_a_run_interrupted_mid_epoch_resumes_to_the_same_weights[SIGTERM-0-19-19]",
    "test_user_path.py::test_a_run_interrupted_mid_epoch_resumes_to_the_same_weights[SIGINT-0-11-11]",
    "test_sweep.py::test_two_workers_share_one_study_to_its_budget",
    "test_sweep.py::test_trials_that_fail_by_themselves_stop_the_worker_after_three",
    "test_sweep.py::test_a_sweep_stopped_by_sigterm_says_so_in_one_line",
    "test_sweep.py::test_a_fit_ends_with_its_worker_killed_as_the_fit_starts",
    "test_sweep.py::test_a_database_that_stops_answering_ends_the_worker_in_one_line_and_the_sweep_resumes",
    "test_sweep.py::test_a_fit_whose_sweep_storage_does_not_answer_ends_in_one_line",
    "test_sweep.py::test_a_killed_sweep_continues_to_its_budget_and_resumes_the_killed_trial",
    "test_sweep.py::test_pruning_stops_a_trial_early_and_keeps_its_checkpoints",
    "test_sweep.py::test_the_report_reads_at_80_columns_and_writes_the_plots",
    "test_sweep.py::test_make_sweep_dashboard_serves_the_study_and_its_trials",
    "test_sweep.py::test_a_trial_killed_with_its_worker_resumes_in_the_fits_runs_dir[--runs_dir scratch/runs]",  # noqa: E501
    "test_own_data.py::test_predict_drops_as_training_did_and_says_how_many",
    "test_own_data.py::test_predict_imputes_as_if_the_medians_were_filled_in_by_hand",
    "test_own_data.py::test_the_exported_model_imputes_as_predict_does",
    "test_own_data.py::test_an_indicator_input_says_where_a_number_was_missing",
)
LOGGER_FILES = ("loggers", "reports", "config", "smoke", "lint", "memory", "sweep")


def _test_files(*names: str) -> list[str]:
    return [f"tests/template/test_{name}.py" for name in names]


PARTS: dict[tuple[str, str], list[list[str]]] = {
    (FULL, name): [_test_files(*names)] for name, names in FULL_PARTS.items()
}
PARTS[FULL, "the rest"] = [
    [f"--ignore={path}" for names in FULL_PARTS.values() for path in _test_files(*names)]
]
REGRESSION = "task=regression,loggers=tensorboard+csv"
for name, names in TASK_PARTS.items():
    deselected = [f"--deselect=tests/template/{test}" for test in ONCE]
    PARTS[REGRESSION, name] = [[*_test_files(*names), *deselected]]
PARTS[REGRESSION, "files"].append(["-m", "not slow", *_test_files("images")])
# Texts with a numeric target, the regression project's own configs for texts.
PARTS[REGRESSION, "files"].append([*_test_files("text"), "-k", "regression"])
PARTS["loggers=none", "logger files"] = [["-m", "not slow", *_test_files(*LOGGER_FILES)]]
# A regression project's loggers take the same paths as a classifier's, but for the images of its
# test report.
PARTS["task=regression,loggers=wandb+csv", "logger files"] = [["-m", "not slow", *_test_files("reports")]]
# pytest-xdist hands the parts out in this order, one at a time to each free worker: the longest
# first (measured by --durations), so that the two workers end together.
LONGEST_FIRST = [
    (FULL, "the rest"),
    (FULL, "checks+outputs+data"),
    (FULL, "texts"),
    (REGRESSION, "files"),
    (FULL, "own_data+resume+sweep+scripts"),
    (FULL, "images+training"),
    (FULL, "ddp+user_path"),
    (REGRESSION, "user_path+resume+sweep+scripts+own_data"),
    (FULL, "backbones"),
    (FULL, "streaming"),
    (FULL, "multinode"),
    ("loggers=none", "logger files"),
    ("task=regression,loggers=wandb+csv", "logger files"),
]
PARTS = {key: PARTS[key] for key in LONGEST_FIRST} | PARTS  # a part left out of the list: last


def test_the_docs_say_what_each_part_covers():
    text = (ROOT / "docs" / "releasing.md").read_text()
    covered = re.findall(r"^\| `([^`]+:[^`]+)` \|", text, re.MULTILINE)
    assert covered == [f"{key}:{part}" for key, part in PARTS]


# PART_DURATIONS=DIR: each part writes its 15 slowest tests (pytest --durations) to DIR.
DURATIONS_DIR = os.environ.get("PART_DURATIONS")
DURATIONS = ["--durations=15"] if DURATIONS_DIR else []


@pytest.mark.slow
@pytest.mark.parametrize(("key", "part"), list(PARTS), ids=[f"{key}:{part}" for key, part in PARTS])
def test_generated_project_tests_pass(generated, key, part, tmp_path):
    # In a copy: what the project's tests write (ruff's cache, runs) stays out of the generated
    # project that the tests above inspect, whichever runs first.
    project = shutil.copytree(generated(key), tmp_path / "project")
    install(project)
    for number, selection in enumerate(PARTS[key, part]):
        args = ["-q", "-p", "no:cacheprovider", "--full", *DURATIONS, *selection]
        result = run_python(project, "-m", "pytest", *args)
        assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
        assert re.search(r"\d+ passed", result.stdout)
        if DURATIONS_DIR:  # where the part's time goes, for CI's length: its slowest tests
            slowest = result.stdout[result.stdout.find("slowest") :].split("\n=")[0]
            name = re.sub(r"[^\w+=,.-]+", "_", f"{key}:{part}:{number}")
            (Path(DURATIONS_DIR) / f"{name}.txt").write_text(slowest)
