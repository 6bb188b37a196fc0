"""Benchmark: the generated project's training loop against a hand-written PyTorch loop.

Generates a project from this template (default answers), then, for each configuration,
runs in turn ``python -m bench_proj fit`` (under a pseudo-terminal, so the progress bar draws
as it does for a user), ``hand.py``, the same training written by hand, and ``bare.py``, the hand
loop's work in a Lightning ``Trainer`` with nothing on (the floor of any project built on the
``Trainer``), several times. Times are measured inside each process (``clock.py`` in the
Lightning runs): steady-state training from
the end of the first optimizer step to the end of the last one, validation excluded; start-up
from the process start to the end of the first optimizer step, and from the end of ``import
lightning`` in the same process (``sitecustomize.py``) to it. Prints medians, then, as the last
line, ``overhead_ratio=<lightning/hand>`` of steady-state time per step on the default config.
The ``images`` case runs ``images.py`` on the same project: the image data module's loader alone
and feeding the CNN's training step, on JPEG photos at 224 and the digits at 16.

All sides run torch on ``--threads`` threads (default 1): on a machine that other processes
also use, two threads that wait on each other at every operation make the time of a step swing
tenfold and more with the load (measured here), which would drown the difference being measured.

    python bench/run.py [--reps 5] [--configs default,no_logger,small_batch,compile,wide,images] [--threads 1]
        [--template GIT_REF] [--keep DIR]
"""

import argparse
import fcntl
import json
import os
import pty
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
TEMPLATE = BENCH.parent
PACKAGE = "bench_proj"

# lightning: the project's fit; hand: hand.py, plain PyTorch; bare: bare.py, the hand loop's work
# in a Lightning Trainer with nothing on (Lightning's own floor); manual: bare.py --manual, the same
# with manual optimization (default configuration only).
SIDES = ["lightning", "hand", "bare"]

# name: (extra CLI arguments, batch size, max_epochs, torch.compile, repetitions, hidden sizes)
CONFIGS = {
    "default": ([], 64, 30, False, None, None),
    "no_logger": (["--trainer.logger=false"], 64, 30, False, 3, None),
    "small_batch": (["--data.init_args.batch_size=16", "--trainer.max_epochs=4"], 16, 4, False, None, None),
    "compile": (["--model.init_args.compile=true"], 64, 30, True, 3, None),
    # A network with 22 times the default's multiply-adds: the same steps, each doing more work.
    "wide": (
        ["--model.init_args.network.init_args.hidden_sizes=[1024,1024]", "--trainer.max_epochs=10"],
        64,
        10,
        False,
        3,
        [1024, 1024],
    ),
}
# Not a training configuration: images.py, the image loader's throughput and the step's waits.
IMAGES = "images"


def generate(directory: Path, ref: str) -> Path:
    project = directory / PACKAGE
    subprocess.run(
        [
            Path(sys.executable).parent / "copier",
            "copy",
            "--quiet",
            "--defaults",
            f"--vcs-ref={ref}",
            "--data",
            f"project_name={PACKAGE}",
            str(TEMPLATE),
            str(project),
        ],
        check=True,
    )
    return project


def run_in_terminal(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
    """Run with stdout and stderr on a 120-column pseudo-terminal, as in an interactive shell; keep the
    output."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 40 rows, 120 columns
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower
    )
    os.close(follower)
    code = process.wait()
    reader.join(timeout=5)
    os.close(leader)
    log.write_bytes(b"".join(chunks))
    if code:
        sys.exit(f"{' '.join(command)} failed with exit code {code}; output in {log}")


def timed_run(command: list[str], cwd: Path, env: dict[str, str], out: Path, terminal: bool) -> dict:
    env = {**env, "BENCH_T0": repr(time.time())}
    started = time.time()
    log = out.with_suffix(".log")
    if terminal:
        run_in_terminal(command, cwd, env, log)
    else:
        with log.open("wb") as file:
            if subprocess.run(command, cwd=cwd, env=env, stdout=file, stderr=subprocess.STDOUT).returncode:
                sys.exit(f"{' '.join(command)} failed; output in {log}")
    result = json.loads(out.read_text())
    result["startup_s"] = result["first_step_wall"] - started
    result["import_s"] = result["lightning_imported_wall"] - started
    result["after_import_s"] = result["first_step_wall"] - result["lightning_imported_wall"]
    result["step_ms"] = 1000 * result["train_s"] / (result["steps"] - 1)
    result["interval_ms"] = 1000 * median(result["intervals_s"])
    result["boundary_ms"] = 1000 * median(result["boundaries_s"]) if result["boundaries_s"] else 0.0
    return result


def median(values) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="runs of each side per configuration")
    choices = [*CONFIGS, IMAGES]
    parser.add_argument(
        "--configs", default=",".join(choices), help="comma-separated, from: " + ", ".join(choices)
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run (OMP_NUM_THREADS)")
    parser.add_argument("--template", default="HEAD", help="the template's git ref (HEAD: the working tree)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    args = parser.parse_args()
    names = args.configs.split(",")
    for name in names:
        if name not in choices:
            parser.error(f"unknown configuration {name!r}; choose from {', '.join(choices)}")

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="bench-"))
    if args.keep and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    project = generate(workdir, args.template)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(project / "src"), str(BENCH)]),
        "WANDB_SILENT": "true",
        "COLUMNS": "120",
        "LINES": "40",
        "OMP_NUM_THREADS": str(args.threads),
    }
    env.pop("BENCH_INIT", None)
    print(
        f"project generated in {project}; {os.cpu_count()} CPUs, torch threads: {args.threads}, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    rows = {}
    for name in (name for name in names if name in CONFIGS):
        extra, batch_size, max_epochs, compiled, reps, hidden_sizes = CONFIGS[name]
        reps = reps or args.reps
        init = workdir / f"{name}-init.pt"
        all_sides = SIDES + (["manual"] if name == "default" else [])
        results: dict[str, list[dict]] = {side: [] for side in all_sides}
        steps = None
        for rep in range(reps):
            sides = all_sides[rep % len(all_sides) :] + all_sides[: rep % len(all_sides)]
            for side in sides:
                if side != "lightning" and steps is None:
                    continue  # the others need the first project run's initial weights and steps
                out = workdir / f"{name}-{side}-{rep}.json"
                if side == "lightning":
                    clock = json.dumps({"class_path": "clock.BenchClock", "init_args": {"out": str(out)}})
                    command = [
                        sys.executable,
                        "-m",
                        PACKAGE,
                        "fit",
                        f"--run_name={name}-{rep}",
                        f"--trainer.callbacks+={clock}",
                        *extra,
                    ]
                    result = timed_run(command, project, {**env, "BENCH_INIT": str(init)}, out, terminal=True)
                    steps = steps or result["steps"]
                else:
                    command = [
                        sys.executable,
                        str(BENCH / ("hand.py" if side == "hand" else "bare.py")),
                        f"--package={PACKAGE}",
                        f"--init={init}",
                        f"--steps={steps}",
                        f"--max-epochs={max_epochs}",
                        f"--batch-size={batch_size}",
                        f"--workdir={workdir / f'{name}-{side}-{rep}'}",
                        f"--out={out}",
                    ]
                    command += ["--compile"] if compiled else []
                    command += ["--manual"] if side == "manual" else []
                    command += [f"--hidden-sizes={','.join(map(str, hidden_sizes))}"] if hidden_sizes else []
                    result = timed_run(command, project, env, out, terminal=False)
                results[side].append(result)
                print(
                    f"  {name} {side:9s} run {rep + 1}/{reps}: {result['step_ms']:.3f} ms/step "
                    f"({result['interval_ms']:.3f} in an epoch, {result['boundary_ms']:.1f} at epoch ends), "
                    f"start-up {result['startup_s']:.2f} s ({result['after_import_s']:.2f} after import "
                    f"lightning), {result['steps']} steps, "
                    f"val/acc {result['val_acc']:.3f}",
                    flush=True,
                )
        rows[name] = results

    if rows:
        print()
        print(
            "ms/step: steady-state training time per step, epoch ends included, validation excluded;\n"
            "step ms: one step inside an epoch; epoch end ms: from an epoch's last step to the end of the\n"
            "next one's first, validation excluded (checkpoints, epoch metrics, loggers, a step).\n"
        )
        print(
            f"{'configuration':14s} {'side':10s} {'ms/step':>9s} {'step ms':>8s} {'epoch end ms':>12s} "
            f"{'train s':>8s} {'start-up s':>10s} {'after import s':>14s} {'val epoch ms':>12s} "
            f"{'peak RSS MB':>11s} {'val/acc':>8s} "
            f"{'runs':>5s}"
        )
        for name, results in rows.items():
            for side, runs in results.items():
                print(
                    f"{name:14s} {side:10s} {median(r['step_ms'] for r in runs):9.3f} "
                    f"{median(r['interval_ms'] for r in runs):8.3f} "
                    f"{median(r['boundary_ms'] for r in runs):12.2f} "
                    f"{median(r['train_s'] for r in runs):8.2f} {median(r['startup_s'] for r in runs):10.2f} "
                    f"{median(r['after_import_s'] for r in runs):14.2f} "
                    f"{1000 * median(t for r in runs for t in r['val_epoch_s']):12.2f} "
                    f"{median(r['peak_rss_mb'] for r in runs):11.0f} "
                    f"{median(r['val_acc'] for r in runs):8.4f} {len(runs):5d}"
                )
        print("\ndata loading, one process (bench/loader.py):", flush=True)
        subprocess.run(
            [sys.executable, str(BENCH / "loader.py"), f"--package={PACKAGE}"],
            cwd=project,
            env=env,
            check=True,
        )
    if IMAGES in names:
        print("\nimage loading and the CNN's step (bench/images.py):", flush=True)
        subprocess.run(
            [
                sys.executable,
                str(BENCH / "images.py"),
                f"--project={project}",
                f"--package={PACKAGE}",
                f"--threads={args.threads}",
            ],
            cwd=project,
            env=env,
            check=True,
        )
    ratios = {}
    for name, results in rows.items():
        step_ms = {side: median(r["step_ms"] for r in runs) for side, runs in results.items()}
        ratios[name] = step_ms["lightning"] / step_ms["hand"]
        per_run = ", ".join(
            f"{lr['step_ms'] / hr['step_ms']:.2f}"
            for lr, hr in zip(results["lightning"], results["hand"], strict=False)
        )
        after_import = {side: median(r["after_import_s"] for r in runs) for side, runs in results.items()}
        imported = median(r["import_s"] for runs in results.values() for r in runs)
        manual = step_ms.get("manual")
        print(
            f"{name}: lightning/hand time per step {ratios[name]:.2f} (per run pair: {per_run}); "
            f"bare Lightning/hand {step_ms['bare'] / step_ms['hand']:.2f}; "
            f"lightning/bare Lightning {step_ms['lightning'] / step_ms['bare']:.2f}; "
            + (f"bare Lightning, manual optimization/hand {manual / step_ms['hand']:.2f}; " if manual else "")
            + f"first step after import lightning ({imported:.2f} s): {after_import['lightning']:.2f} s "
            f"(bare Lightning {after_import['bare']:.2f} s, hand {after_import['hand']:.2f} s)"
        )
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    if "default" in ratios:
        print(f"overhead_ratio={ratios['default']:.2f}")


if __name__ == "__main__":
    main()
