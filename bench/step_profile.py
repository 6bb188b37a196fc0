"""Where a training step's time goes: the project's fit against the bare ``Trainer``, sampled by py-spy.

Generates a project (default answers), then runs the ``long_epoch`` workload of ``run.py`` (the
default model on 64,000 samples of digits' shape, 700 steps an epoch, 2 epochs) on two sides,
``--rounds`` times each in the order project, bare, bare, project, each run under
``py-spy record``: the project's ``fit`` on a pseudo-terminal (progress bar and default loggers
on, as a user runs it), and ``bare.py`` (the same work in a ``Trainer`` with nothing on). Every
sample of the training process's main thread is put in one part by its stack, the first of
these that matches:

    validation           inside Lightning's evaluation loop
    callbacks: <file>    inside a callback's hook, by the file that defines it
    self.log             LightningModule.log and log_dict
    metrics              torchmetrics, outside self.log
    backward             the backward pass
    forward and loss     the rest of training_step
    gradient clipping    the norm and the clipping
    optimizer            AdamW's update and the learning rate schedule
    loader               the next batch, through Lightning's fetcher
    Lightning's loop     the rest of the fit loop: hooks, closures, progress counters
    outside the loop     start-up, set-up and teardown, not counted per step

and the table gives each part in milliseconds per optimizer step (samples / rate / steps), for
both sides and the difference. py-spy samples without stopping the process; at 250 samples a
second, one sample is 4 ms, and a part below about 0.02 ms a step is noise.

    python bench/step_profile.py [--rate 250] [--rounds 2] [--keep DIR] [--again DIR]   # py-spy: pip install py-spy
"""

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from run import BENCH, PACKAGE, WORKLOADS, generate, run_in_terminal, write_long_epoch_data

FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
OUTSIDE = "outside the loop"


def part(frames: list[tuple[str, str]]) -> str:
    """The part of the fit that one sample's stack, outermost frame first, belongs to."""
    in_loop = next((i for i, (_, file) in enumerate(frames) if file.endswith("loops/fit_loop.py")), None)
    if in_loop is None:
        return OUTSIDE
    frames = frames[in_loop:]
    files = [file for _, file in frames]
    functions = [function.rsplit(".", 1)[-1] for function, _ in frames]  # py-spy writes Class.method
    if any(file.endswith("evaluation_loop.py") for file in files):
        return "validation"
    if "_call_callback_hooks" in functions:
        hook = frames[functions.index("_call_callback_hooks") + 1 :]
        if hook and hook[0][1].endswith("contextlib.py"):
            return "callbacks: Lightning's profiler context around each hook"
        owner, _, method = hook[0][0].rpartition(".") if hook else ("", "", "")
        if method.startswith("on_") or method in ("setup", "teardown", "state_dict", "load_state_dict"):
            return f"callbacks: {owner}"
        return "callbacks: Lightning's hook calls"
    if any(file.endswith("core/module.py") and function in ("log", "log_dict") for function, file in frames):
        return "self.log"
    if any("torchmetrics" in file for file in files):
        return "metrics"
    if "backward" in functions or any("autograd" in file for file in files):
        return "backward"
    if "training_step" in functions:
        return "forward and loss"
    if any("clip_grad" in function for function in functions):
        return "gradient clipping"
    if any(file.endswith(("adamw.py", "optim/optimizer.py", "lr_scheduler.py")) for file in files):
        return "optimizer"
    if any(file.endswith("loops/fetchers.py") for file in files):
        return "loader"
    return "Lightning's loop"


def parts(raw: Path) -> collections.Counter:
    """Samples by part, from py-spy's raw output (one ``stack count`` line per distinct stack). Other
    threads' stacks start in ``threading.py``, outside the loop."""
    counts: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [(m["function"], m["file"]) for m in map(FRAME.match, stack.split(";")) if m]
        counts[part(frames)] += int(count)
    return counts


def profile(side: str, command: list[str], project: Path, env: dict, out: Path, rate: int) -> None:
    raw = out.with_suffix(".raw")
    spy = [shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"), "record", "--format=raw"]
    spy += [f"--rate={rate}", "--nolineno", "--full-filenames", f"--output={raw}", "--"]
    if side == "project":
        run_in_terminal([*spy, *command], project, env, out.with_suffix(".log"))
    else:
        with out.with_suffix(".log").open("wb") as log:
            subprocess.run([*spy, *command], cwd=project, env=env, stdout=log, stderr=log, check=True)


def summary(outs: list[Path]) -> dict:
    """One side's runs together: their samples by part, steps and fit times summed."""
    timings = [json.loads(out.read_text()) for out in outs]
    samples = sum((parts(out.with_suffix(".raw")) for out in outs), collections.Counter())
    steps = sum(timing["steps"] for timing in timings)
    return {"samples": samples, "steps": steps, "fit_s": [timing["fit_s"] for timing in timings]}


def tabulate(sides: dict[str, dict], rate: int) -> None:
    def ms(side: str, name: str) -> float:
        return 1000 * sides[side]["samples"][name] / rate / sides[side]["steps"]

    names = sorted({name for side in sides.values() for name in side["samples"]} - {OUTSIDE})
    names.sort(key=lambda name: -ms("project", name))
    runs = len(sides["project"]["fit_s"])
    print(
        f"\nms a step, {sides['project']['steps']} steps in {runs} runs a side, py-spy at {rate} samples a second\n"
    )
    print("| part | project | bare | project - bare |\n| --- | ---: | ---: | ---: |")
    rows = [(name, ms("project", name), ms("bare", name)) for name in names]
    rows.append(("**in the loop**", sum(row[1] for row in rows), sum(row[2] for row in rows)))
    for name, project_ms, bare_ms in rows:
        print(f"| {name} | {project_ms:.3f} | {bare_ms:.3f} | {project_ms - bare_ms:+.3f} |")
    fits = {side: ", ".join(f"{fit:.2f}" for fit in sides[side]["fit_s"]) for side in sides}
    print(f"\nfit s: project {fits['project']}; bare {fits['bare']}")


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rate", type=int, default=250, help="py-spy's samples a second")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, in the order ABBA ABBA")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    parser.add_argument("--again", type=Path, help="only tabulate the profiles kept in this directory")
    args = parser.parse_args()
    if args.again:
        sides = {side: summary(sorted(args.again.glob(f"{side}-*.json"))) for side in ("project", "bare")}
        return tabulate(sides, args.rate)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="profile-"))
    if args.keep and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    project = generate(workdir, "HEAD")
    data = workdir / "long_epoch.npz"
    write_long_epoch_data(data)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(project / "src"), str(BENCH)]),
        "WANDB_SILENT": "true",
        "COLUMNS": "120",
        "OMP_NUM_THREADS": "1",
        "BENCH_INIT": str(workdir / "init.pt"),
    }
    workload = WORKLOADS["long_epoch"]
    outs: dict[str, list[Path]] = {"project": [], "bare": []}
    steps = None
    for round_ in range(args.rounds):
        order = ["project", "bare"] if round_ % 2 == 0 else ["bare", "project"]
        for side in order if steps else ["project", "bare"]:
            out = workdir / f"{side}-{round_}.json"
            if side == "project":
                clock = json.dumps({"class_path": "clock.BenchClock", "init_args": {"out": str(out)}})
                command = [sys.executable, "-m", PACKAGE, "fit", f"--run_name=profile-{round_}"]
                command += [f"--trainer.callbacks+={clock}", *workload.project_args]
                command += [f"--data.init_args.path={data}"]
            else:
                command = [sys.executable, str(BENCH / "bare.py"), f"--package={PACKAGE}"]
                command += [f"--init={workdir / 'init.pt'}", f"--steps={steps}"]
                command += [f"--max-epochs={workload.max_epochs}", f"--batch-size={workload.batch_size}"]
                command += [f"--data-file={data}", f"--workdir={workdir / f'bare-{round_}'}", f"--out={out}"]
            profile(side, command, project, env, out, args.rate)
            steps = steps or json.loads(out.read_text())["steps"]
            outs[side].append(out)
    tabulate({side: summary(paths) for side, paths in outs.items()}, args.rate)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
