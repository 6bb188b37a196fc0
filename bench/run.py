"""Benchmark: what the generated project's training costs over Lightning itself and over plain PyTorch.

Generates a project from this template (default answers) and times two workloads, each trained
by four sides in turn, several rounds, the sides' order rotating from round to round:

- ``project``: ``python -m bench_proj fit`` on the project's default config, under a
  pseudo-terminal so that the progress bar draws as it does for a user, wandb (offline) on;
- ``no_logger``: the same with ``--trainer.logger=false``;
- ``bare``: ``bare.py``, the hand loop's work in a Lightning ``Trainer`` with nothing on (the
  floor of any project built on the ``Trainer``), on the project's data module;
- ``hand``: ``hand.py``, the same training written by hand in plain PyTorch.

Workloads: ``default``, the default config (digits, 20 steps an epoch, 30 epochs), where fixed
costs at each epoch's end weigh most; ``long_epoch``, the default model on 64,000 samples of
digits' shape (700 steps an epoch, 2 epochs; resampled digits with noise, drawn once from a fixed
seed), where the cost of each step does; ``ddp``, long_epoch in two DDP processes on the CPU
(``configs/trainer/ddp_cpu.yaml``; 350 steps an epoch each), against ``bare.py --devices 2``,
by three sides (no ``hand``); ``images``, the CNN of ``configs/model/cnn.yaml`` on 64 x 64 images
with ``configs/data/images.yaml`` (512 digits upscaled to 64 pixels and written as PNG files by
this script, in class folders: 6 steps an epoch of about a second each, 2 epochs), against
``bare.py --images``, by three sides: a step there is a real model's, and the ratio is the one
users of real models see.
Times are measured inside each process (``clock.py`` in the Lightning runs): a step inside an
epoch, an epoch's end (from its last step to the end of the next one's first, validation
excluded), the whole fit (sanity check, epochs, validation, checkpoints, loggers), and start-up
from the end of ``import lightning`` (``sitecustomize.py``) to the end of the first optimizer
step, in the same process. Prints the medians with their spread, then these lines:

    project_over_bare[default]=X.XX     the project's fit time over the bare Trainer's
    project_over_bare[long_epoch]=X.XX  (the median of the rounds' ratios)
    project_over_bare[ddp]=X.XX
    project_over_bare[images]=X.XX
    startup_after_import_lightning_s=X.XX  the default config's, logger included (median)

and one line for each ratio's ceiling (``CEILINGS``), ``pass`` or ``FAIL``; the exit status is 1
when one fails.

``--configs`` also takes ``small_batch``, ``compile`` and ``wide`` (three sides: project, bare,
hand), and ``image_loading``, which runs ``images.py`` on the same project: the image data
module's loader alone and feeding the CNN's training step, on JPEG photos at 224 and the digits at
16.

All sides run torch on ``--threads`` threads (default 1): on a machine that other processes
also use, two threads that wait on each other at every operation make the time of a step swing
tenfold and more with the load (measured here), which would drown the difference being measured.

    python bench/run.py [--reps 5] [--configs default,long_epoch] [--threads 1]
        [--template GIT_REF] [--keep DIR]
"""

import argparse
import fcntl
import json
import os
import pty
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

BENCH = Path(__file__).resolve().parent
TEMPLATE = BENCH.parent
PACKAGE = "bench_proj"

# The sides of a workload. project and no_logger are the project's fit; bare is bare.py, the hand
# loop's work in a Lightning Trainer with nothing on (Lightning's own floor); hand is hand.py.
SIDES = ["project", "no_logger", "bare", "hand"]
LONG_EPOCH_SAMPLES = 64_000  # 70% train: 44,800 samples, 700 steps an epoch at batch 64
IMAGE_COUNT = 512  # 70% train: 358 images, 6 steps an epoch at batch 64, about a second each
IMAGE_SIZE = 64  # configs/data/images.yaml's image_size: written at it, no resizing but the crops'
# The ratios' ceilings. Over a 1.5 ms step the project's callbacks (each a guarantee: exact resume,
# the record, the monitored metric's check) cost Lightning's hook dispatch; over a real model's
# step (images) they vanish.
CEILINGS = {"default": 1.6, "long_epoch": 1.35, "ddp": 1.25, "images": 1.05}


class Workload(NamedTuple):
    project_args: list[str]  # added to the project's fit command
    batch_size: int
    max_epochs: int
    sides: list[str]
    reps: int | None = None  # None: --reps
    compiled: bool = False
    hidden_sizes: list[int] | None = None
    data_file: bool = False  # trains on the long-epoch file instead of digits
    devices: int = 1  # CPU processes: DDP over gloo above 1
    images: bool = False  # the CNN on the folder of images instead of the MLP


WORKLOADS = {
    "default": Workload([], 64, 30, SIDES),
    "long_epoch": Workload(
        ["--config=configs/data/file.yaml", "--data.init_args.standardize=false", "--trainer.max_epochs=2"],
        64,
        2,
        SIDES,
        data_file=True,
    ),
    # long_epoch in two DDP processes (configs/trainer/ddp_cpu.yaml): 350 steps an epoch each.
    "ddp": Workload(
        [
            "--config=configs/trainer/ddp_cpu.yaml",
            "--config=configs/data/file.yaml",
            "--data.init_args.standardize=false",
            "--trainer.max_epochs=2",
        ],
        64,
        2,
        ["project", "no_logger", "bare"],
        data_file=True,
        devices=2,
    ),
    # The CNN on 64 x 64 images, configs/data/images.yaml as it is (one loader worker on 2 CPUs).
    "images": Workload(
        ["--config=configs/data/images.yaml", "--config=configs/model/cnn.yaml", "--trainer.max_epochs=2"],
        64,
        2,
        ["project", "no_logger", "bare"],
        3,
        images=True,
    ),
    "small_batch": Workload(
        ["--data.init_args.batch_size=16", "--trainer.max_epochs=4"], 16, 4, ["project", "bare", "hand"]
    ),
    "compile": Workload(["--model.init_args.compile=true"], 64, 30, ["project", "bare", "hand"], 3, True),
    # A network with 22 times the default's multiply-adds: the same steps, each doing more work.
    "wide": Workload(
        ["--model.init_args.network.init_args.hidden_sizes=[1024,1024]", "--trainer.max_epochs=10"],
        64,
        10,
        ["project", "bare", "hand"],
        3,
        hidden_sizes=[1024, 1024],
    ),
}
DEFAULT_CONFIGS = ["default", "long_epoch", "ddp", "images"]
# Not a training workload: images.py, the image loader's throughput and the step's waits.
IMAGE_LOADING = "image_loading"


def write_long_epoch_data(path: Path) -> None:
    """64,000 samples of digits' shape: digits drawn with replacement, with noise, from a fixed seed."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(0)
    index = rng.integers(len(digits.target), size=LONG_EPOCH_SAMPLES)
    noise = rng.normal(0.0, 1.0, size=(LONG_EPOCH_SAMPLES, digits.data.shape[1]))
    features = np.clip(digits.data[index] + noise, 0, 16).astype(np.float32)
    np.savez(path, features=features, labels=digits.target[index])


def write_images(folder: Path) -> None:
    """The first ``IMAGE_COUNT`` digits, upscaled to ``IMAGE_SIZE`` pixels, as grey PNG files in
    one folder per class."""
    import torch
    from sklearn.datasets import load_digits
    from torchvision.io import write_png
    from torchvision.transforms.v2.functional import resize

    digits = load_digits()
    pixels = torch.from_numpy(digits.images[:IMAGE_COUNT] * 255 / 16).round().to(torch.uint8)
    images = resize(pixels[:, None], [IMAGE_SIZE, IMAGE_SIZE], antialias=True)
    for sample, (image, digit) in enumerate(zip(images, digits.target, strict=False)):
        (folder / str(digit)).mkdir(parents=True, exist_ok=True)
        write_png(image, str(folder / str(digit) / f"{sample:04d}.png"))


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


def run_in_terminal(
    command: list[str], cwd: Path, env: dict[str, str], log: Path, timeout: float | None = None
) -> float:
    """Run with stdout and stderr on a 120-column pseudo-terminal, as in an interactive shell, in a
    session of its own; keep the output. Killed with its whole process group after ``timeout``
    seconds, if given. Its wall time, or the benchmark exits saying why."""
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
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
    )
    os.close(follower)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        code = f"killed after {timeout:.0f} s"
    wall = time.perf_counter() - started
    reader.join(timeout=5)
    os.close(leader)
    log.write_bytes(b"".join(chunks))
    if code:
        sys.exit(f"{' '.join(command)} failed ({code}); output in {log}")
    return wall


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
    result["run_s"] = time.time() - started
    result["startup_s"] = result["first_step_wall"] - started
    result["import_s"] = result["lightning_imported_wall"] - started
    result["after_import_s"] = result["first_step_wall"] - result["lightning_imported_wall"]
    result["step_ms"] = 1000 * result["train_s"] / (result["steps"] - 1)
    result["interval_ms"] = 1000 * median(result["intervals_s"])
    result["boundary_ms"] = 1000 * median(result["boundaries_s"]) if result["boundaries_s"] else 0.0
    return result


def median(values) -> float:
    return statistics.median(values)


def spread(values: list[float], digits: int = 2) -> str:
    """The median of values, and their range."""
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def side_command(side: str, workload: Workload, name: str, rep: int, workdir: Path, out: Path, steps: int):
    """The command line of one run of a side that is not the project's (bare.py or hand.py)."""
    command = [
        sys.executable,
        str(BENCH / f"{side}.py"),
        f"--package={PACKAGE}",
        f"--init={workdir / f'{name}-init.pt'}",
        f"--steps={steps}",
        f"--max-epochs={workload.max_epochs}",
        f"--batch-size={workload.batch_size}",
        f"--workdir={workdir / f'{name}-{side}-{rep}'}",
        f"--out={out}",
    ]
    command += ["--compile"] if workload.compiled else []
    if workload.hidden_sizes:
        command.append(f"--hidden-sizes={','.join(map(str, workload.hidden_sizes))}")
    command += [f"--data-file={workdir / 'long_epoch.npz'}"] if workload.data_file else []
    command += [f"--devices={workload.devices}"] if workload.devices > 1 else []
    command += [f"--images={workdir / 'images'}"] if workload.images else []
    return command


def run_workload(name: str, workload: Workload, reps: int, project: Path, workdir: Path, env: dict) -> dict:
    """Every side of a workload, ``reps`` rounds, the sides' order rotating; the results by side."""
    results: dict[str, list[dict]] = {side: [] for side in workload.sides}
    extra = list(workload.project_args)
    if workload.data_file:
        extra.append(f"--data.init_args.path={workdir / 'long_epoch.npz'}")
    if workload.images:
        extra.append(f"--data.init_args.root={workdir / 'images'}")
    steps = None
    for rep in range(reps):
        sides = workload.sides[rep % len(workload.sides) :] + workload.sides[: rep % len(workload.sides)]
        if steps is None:  # the others need the first project run's initial weights and steps
            sides = ["project", *(side for side in sides if side != "project")]
        for side in sides:
            out = workdir / f"{name}-{side}-{rep}.json"
            if side in ("project", "no_logger"):
                clock = json.dumps({"class_path": "clock.BenchClock", "init_args": {"out": str(out)}})
                command = [sys.executable, "-m", PACKAGE, "fit", f"--run_name={name}-{side}-{rep}"]
                command += [f"--trainer.callbacks+={clock}", *extra]
                command += ["--trainer.logger=false"] if side == "no_logger" else []
                run_env = {**env, "BENCH_INIT": str(workdir / f"{name}-init.pt")}
                result = timed_run(command, project, run_env, out, terminal=True)
                steps = steps or result["steps"]
            else:
                command = side_command(side, workload, name, rep, workdir, out, steps)
                result = timed_run(command, project, env, out, terminal=False)
            results[side].append(result)
            print(
                f"  {name} {side:9s} round {rep + 1}/{reps}: {result['interval_ms']:.3f} ms a step, "
                f"{result['boundary_ms']:.1f} ms an epoch end, fit {result['fit_s']:.2f} s, "
                f"{result['after_import_s']:.2f} s from import lightning to the first step, "
                f"{result['steps']} steps, val/acc {result['val_acc']:.3f}",
                flush=True,
            )
    return results


def round_ratios(results: dict[str, list[dict]], side: str, over: str) -> list[float]:
    """The fit time of ``side`` over that of ``over``, round by round."""
    return [a["fit_s"] / b["fit_s"] for a, b in zip(results[side], results[over], strict=True)]


def print_table(rows: dict[str, dict[str, list[dict]]]) -> None:
    print(
        "\nMedians over the rounds, with their range. step ms: one step inside an epoch; epoch end ms:\n"
        "from an epoch's last step to the end of the next one's first, validation excluded\n"
        "(checkpoints, epoch metrics, loggers, one step); fit s: the whole fit, validation included;\n"
        "run s: the process, start to exit; after import s: from the end of import lightning to the\n"
        "end of the first optimizer step.\n"
    )
    header = f"{'workload':12s} {'side':10s} {'step ms':>19s} {'epoch end ms':>19s} {'fit s':>19s}"
    header += f" {'run s':>7s} {'after import s':>19s} {'val epoch ms':>12s} {'peak MB':>8s} {'val/acc':>7s}"
    print(header)
    for name, results in rows.items():
        for side, runs in results.items():
            print(
                f"{name:12s} {side:10s} {spread([r['interval_ms'] for r in runs], 3):>19s} "
                f"{spread([r['boundary_ms'] for r in runs]):>19s} {spread([r['fit_s'] for r in runs]):>19s} "
                f"{median(r['run_s'] for r in runs):7.2f} {spread([r['after_import_s'] for r in runs]):>19s} "
                f"{1000 * median(t for r in runs for t in r['val_epoch_s']):12.2f} "
                f"{median(r['peak_rss_mb'] for r in runs):8.0f} {median(r['val_acc'] for r in runs):7.4f}"
            )
    print()
    for name, results in rows.items():
        step = {side: median(r["interval_ms"] for r in runs) for side, runs in results.items()}
        end = {side: median(r["boundary_ms"] for r in runs) for side, runs in results.items()}
        parts = [f"project/bare fit {spread(round_ratios(results, 'project', 'bare'))}"]
        if "no_logger" in results:
            parts.append(f"no_logger/bare fit {spread(round_ratios(results, 'no_logger', 'bare'))}")
        if "hand" in results:
            parts.append(f"bare/hand fit {spread(round_ratios(results, 'bare', 'hand'))}")
        parts.append(f"step ms over bare's: project +{step['project'] - step['bare']:.3f}")
        parts.append(f"epoch end ms over bare's: project +{end['project'] - end['bare']:.1f}")
        print(f"{name}: " + "; ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="rounds of each workload")
    choices = [*WORKLOADS, IMAGE_LOADING]
    parser.add_argument(
        "--configs", default=",".join(DEFAULT_CONFIGS), help="comma-separated, from: " + ", ".join(choices)
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run (OMP_NUM_THREADS)")
    parser.add_argument("--template", default="HEAD", help="the template's git ref (HEAD: the working tree)")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it")
    args = parser.parse_args()
    names = args.configs.split(",")
    for name in names:
        if name not in choices:
            parser.error(f"unknown configuration {name!r}; choose from {', '.join(choices)}")

    began = time.time()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="bench-"))
    if args.keep and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    project = generate(workdir, args.template)
    write_long_epoch_data(workdir / "long_epoch.npz")
    if any(WORKLOADS[name].images for name in names if name in WORKLOADS):
        write_images(workdir / "images")
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
    for name in (name for name in names if name in WORKLOADS):
        workload = WORKLOADS[name]
        rows[name] = run_workload(name, workload, workload.reps or args.reps, project, workdir, env)
    if rows:
        print_table(rows)
    if IMAGE_LOADING in names:
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
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{time.time() - began:.0f} s in all; load average at the end: {os.getloadavg()[0]:.1f}")
    ratios = {name: median(round_ratios(rows[name], "project", "bare")) for name in CEILINGS if name in rows}
    for name, ratio in ratios.items():
        print(f"project_over_bare[{name}]={ratio:.2f}")
    if "default" in rows:
        startup = median(r["after_import_s"] for r in rows["default"]["project"])
        print(f"startup_after_import_lightning_s={startup:.2f}")
    failed = [name for name, ratio in ratios.items() if round(ratio, 2) > CEILINGS[name]]
    for name, ratio in ratios.items():
        verdict = "FAIL" if name in failed else "pass"
        print(f"ceiling project_over_bare[{name}] {ratio:.2f} <= {CEILINGS[name]:.2f}: {verdict}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
