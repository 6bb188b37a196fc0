"""Benchmark: a sweep's cost over its trials' fits, by how its trials start.

Generates a project from this template (default answers) and runs the same study three ways,
one after another, each from a command's start to its end, on a pseudo-terminal of 120 columns
(the progress bars draw as they do for a user; the project's default loggers are on):

- ``cold``: ``python scripts/sweep.py`` on a sweep file with ``start: cold``: every trial a new
  ``python -m bench_proj fit`` process, which imports Lightning and the project again;
- ``warm``: the same with ``start: warm``: every trial forked from a process that imported the
  project once;
- ``bare_loop``: ``bench/sweep_loop.py``, an Optuna study over a bare Lightning ``Trainer`` and a
  plain ``LightningModule`` in one process, as lightning-hydra-template's Hydra-Optuna multirun
  runs its trials.

The study is the same for all three: ``--trials`` trials of ``--epochs`` epochs on the project's
default data and model (digits, the MLP), the learning rate log-uniform in [3e-4, 3e-2] and the
dropout uniform in [0, 0.3], TPE seeded with 0 after 4 random trials, no pruning (every trial
trains every epoch). For each side it prints the wall time and the sum of the trials' own fit
times: each fit's ``wall_time_s`` in the project's experiments.jsonl for the project's sides, each
``trainer.fit`` call for the bare loop. Ends with:

    sweep_over_trial_fits=X.XX        the warm sweep's wall time over its trials' fit times
    sweep_over_trial_fits[cold]=X.XX
    goal sweep_over_trial_fits <= 1.50: pass or FAIL
    warm_beats_bare_loop: pass or FAIL (the warm sweep's wall time against the bare loop's)

Every command has a hard time limit (``--timeout``), after which its process group is killed.

    python bench/sweep.py [--trials 8] [--epochs 4] [--threads 1] [--timeout 900]
        [--template GIT_REF] [--keep DIR]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml
from run import generate, run_in_terminal
from sweep_loop import DROPOUT, DROPOUT_RANGE, LR, LR_RANGE

BENCH = Path(__file__).resolve().parent
GOAL = 1.5  # the warm sweep's wall time over the sum of its trials' fit times
STARTS = ("cold", "warm")


def sweep_file(start: str, trials: int) -> dict:
    """The sweep file of a project side: the same study as ``sweep_loop.py``'s."""
    return {
        "name": f"bench_{start}",
        "metric": "val/acc",
        "direction": "maximize",
        "trials": trials,
        "sampler": "tpe",
        "startup_trials": 4,
        "pruner": "none",
        "seed": 0,
        "start": start,
        "parameters": {
            LR: {"low": LR_RANGE[0], "high": LR_RANGE[1], "log": True},
            DROPOUT: {"low": DROPOUT_RANGE[0], "high": DROPOUT_RANGE[1]},
        },
    }


def trial_fit_times(project: Path, name: str, trials: int) -> list[float]:
    """The ``wall_time_s`` of each finished fit of the study ``name`` in experiments.jsonl."""
    lines = [json.loads(line) for line in (project / "experiments.jsonl").read_text().splitlines() if line]
    fits = [
        line
        for line in lines
        if line.get("stage") == "fit" and str(line.get("run_name", "")).startswith(f"{name}-")
    ]
    if len(fits) != trials or any(fit["status"] != "finished" for fit in fits):
        statuses = [fit["status"] for fit in fits]
        sys.exit(f"{name}: experiments.jsonl holds {len(fits)} fits ({statuses}), not {trials} finished")
    return [fit["wall_time_s"] for fit in fits]


def run_project_side(start: str, args: argparse.Namespace, project: Path, env: dict) -> dict:
    name = f"bench_{start}"
    path = project / "configs" / "sweep" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep_file(start, args.trials), sort_keys=False))
    command = [sys.executable, "scripts/sweep.py", str(path.relative_to(project))]
    command += ["--", f"--trainer.max_epochs={args.epochs}"]
    log = project.parent / f"{name}.log"
    wall = run_in_terminal(command, project, env, log, args.timeout)
    # A warm sweep whose server could not start says so in one line, and starts its trials cold.
    notes = [line for line in log.read_text(errors="replace").splitlines() if "warm starts are off" in line]
    return {"wall_s": wall, "fit_s": trial_fit_times(project, name, args.trials), "notes": notes[:1]}


def run_bare_loop(args: argparse.Namespace, workdir: Path, env: dict) -> dict:
    out = workdir / "bare_loop.json"
    command = [sys.executable, str(BENCH / "sweep_loop.py"), f"--trials={args.trials}"]
    command += [f"--epochs={args.epochs}", f"--workdir={workdir / 'bare_loop'}", f"--out={out}"]
    wall = run_in_terminal(command, workdir, env, workdir / "bare_loop.log", args.timeout)
    return {"wall_s": wall, "fit_s": json.loads(out.read_text())["fit_s"]}


def report(results: dict[str, dict]) -> None:
    print(f"\n{'side':10s} {'wall s':>8s} {'trial fits s':>13s} {'a fit s':>8s} {'wall / fits':>12s}")
    for side, result in results.items():
        fits = result["fit_s"]
        print(
            f"{side:10s} {result['wall_s']:8.1f} {sum(fits):13.1f} {sorted(fits)[len(fits) // 2]:8.2f} "
            f"{result['wall_s'] / sum(fits):12.2f}"
        )
    warm, cold, bare = results["warm"], results["cold"], results["bare_loop"]
    ratio = warm["wall_s"] / sum(warm["fit_s"])
    print(f"\nsweep_over_trial_fits={ratio:.2f}")
    print(f"sweep_over_trial_fits[cold]={cold['wall_s'] / sum(cold['fit_s']):.2f}")
    print(f"goal sweep_over_trial_fits <= {GOAL:.2f}: {'pass' if round(ratio, 2) <= GOAL else 'FAIL'}")
    beats = warm["wall_s"] < bare["wall_s"]
    print(
        f"warm_beats_bare_loop: {'pass' if beats else 'FAIL'} "
        f"(warm {warm['wall_s']:.1f} s, bare loop {bare['wall_s']:.1f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run (OMP_NUM_THREADS)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds each side may take")
    parser.add_argument("--template", default="HEAD", help="the template's git ref (HEAD: the working tree)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    args = parser.parse_args()

    began = time.time()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    if args.keep and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    project = generate(workdir, args.template)
    env = {
        **os.environ,
        "PYTHONPATH": str(project / "src"),
        "WANDB_SILENT": "true",
        "COLUMNS": "120",
        "LINES": "40",
        "OMP_NUM_THREADS": str(args.threads),
    }
    print(f"project generated in {project}; load average {os.getloadavg()[0]:.1f}", flush=True)
    results = {}
    for start in STARTS:
        results[start] = run_project_side(start, args, project, env)
        print(
            f"  {start}: {results[start]['wall_s']:.1f} s, fits {sum(results[start]['fit_s']):.1f} s",
            flush=True,
        )
    results["bare_loop"] = run_bare_loop(args, workdir, env)
    print(f"  bare_loop: {results['bare_loop']['wall_s']:.1f} s", flush=True)
    for start in STARTS:
        for note in results[start]["notes"]:
            print(f"{start}: the sweep said: {note.strip()}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{time.time() - began:.0f} s in all; load average at the end: {os.getloadavg()[0]:.1f}")
    report(results)


if __name__ == "__main__":
    main()
