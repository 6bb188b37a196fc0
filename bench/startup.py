"""Benchmark: the generated project's commands, start-up included, against ``import lightning``.

Generates a project from this template (default answers), or takes one already generated
(``--project``), then times whole processes, wall clock from start to exit, ``--reps`` rounds:

- ``import_lightning``: ``python -c "import lightning"``, the floor of any command built on Lightning;
- ``import_cli``: ``python -c "import <package>.cli"``, the project's imports on top of Lightning's;
- ``fit_help``: ``fit --help``, the command line built and printed, no data, model or trainer;
- ``fit``: one epoch on 64 samples (``--trainer.max_epochs=1 --data.init_args.subset=64``), the
  default config otherwise, wandb (offline) included;
- ``fit_no_logger``: the same with ``--trainer.logger=false``: the difference is wandb's;
- ``test``, ``predict``: ``--ckpt_path=last`` of that fit's run, as a user runs them;
- ``export``: ``python scripts/export.py`` on its ``last.ckpt`` (ONNX where installed, torch.export).

``import_lightning`` is timed in every round, just before the commands, and each command's ratio
is over the same round's: the import's time varies by seconds with the machine's load and what its
file cache holds. Both the floor and ``import_cli`` import as any Python program does; the
commands go through the project's ``__main__.py``, which imports with the garbage collector held
off, so that one can take less than the floor. The work in these commands is milliseconds (64
samples, one step): what is left above the floor is start-up and each command's fixed costs.

Prints the medians, then one line per command, the median of the rounds' ratios:

    over_import_lightning[fit]=X.XX     the command's wall time over import lightning's

    python bench/startup.py [--reps 3] [--template GIT_REF] [--project DIR] [--keep DIR]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run import generate

FLOOR = "import_lightning"


def commands(package: str, run_name: str) -> dict[str, list[str]]:
    """What each side runs, in this order; test, predict and export use what fit wrote."""
    python = sys.executable
    fit = [python, "-m", package, "fit", "--trainer.max_epochs=1", "--data.init_args.subset=64"]
    return {
        FLOOR: [python, "-c", "import lightning"],
        "import_cli": [python, "-c", f"import {package}.framework.cli"],
        "fit_help": [python, "-m", package, "fit", "--help"],
        "fit": [*fit, f"--run_name={run_name}"],
        "fit_no_logger": [*fit, "--trainer.logger=false", f"--run_name={run_name}-no-logger"],
        "test": [python, "-m", package, "test", "--ckpt_path=last", f"--run_name={run_name}"],
        "predict": [python, "-m", package, "predict", "--ckpt_path=last", f"--run_name={run_name}"],
        "export": [python, "scripts/export.py", f"--ckpt_path=checkpoints/{run_name}/last.ckpt"],
    }


def timed(command: list[str], project: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode:
        sys.exit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return elapsed


def package_of(project: Path) -> str:
    # The command line is in framework/ since v0.17.0, at the package's top before.
    found = [*(project / "src").glob("*/framework/cli.py"), *(project / "src").glob("*/cli.py")]
    [package] = {path.relative_to(project / "src").parts[0] for path in found}
    return package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="rounds of every command")
    parser.add_argument("--template", default="HEAD", help="the template's git ref to generate from")
    parser.add_argument("--project", type=Path, help="a project already generated, instead of a new one")
    parser.add_argument("--keep", type=Path, help="keep the generated project and runs in this directory")
    args = parser.parse_args()
    if args.project:
        workdir, project = None, args.project.resolve()
    else:
        workdir = args.keep or Path(tempfile.mkdtemp(prefix="bench-startup-"))
        workdir.mkdir(parents=True, exist_ok=True)
        project = generate(workdir, args.template)
    package = package_of(project)
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    times: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for rep in range(args.reps):
        run_name = f"startup-{os.getpid()}-{rep}"
        for side, command in commands(package, run_name).items():
            times.setdefault(side, []).append(timed(command, project, env))
            ratios.setdefault(side, []).append(times[side][-1] / times[FLOOR][-1])
            print(f"round {rep + 1}/{args.reps}  {side:<16} {times[side][-1]:6.2f} s", file=sys.stderr)
        if args.project:  # leave the user's project as it was
            for name in (run_name, f"{run_name}-no-logger"):
                shutil.rmtree(project / "checkpoints" / name, ignore_errors=True)

    print(f"{'command':<16} {'median s':>9} {'min s':>7} {'max s':>7} {'over import lightning':>22}")
    for side, values in times.items():
        median, ratio = statistics.median(values), statistics.median(ratios[side])
        print(f"{side:<16} {median:>9.2f} {min(values):>7.2f} {max(values):>7.2f} {ratio:>22.2f}")
    for side in times:
        if side != FLOOR:
            print(f"over_import_lightning[{side}]={statistics.median(ratios[side]):.2f}")
    if workdir is not None and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
