"""Fault injection: a generated project's training run, SIGKILLed twelve times, at each kind of
point listed below and at random ones, resumes every time and ends exactly as a run that was
never killed.

What it proves, with the default config (progress bar, wandb logger, best and last checkpoints;
only data and epochs shrunk):

- A kill anywhere leaves only checkpoints that load (``read_checkpoint``), including kills in the
  middle of ``torch.save`` writing the temporary file, after the temporary file is complete but
  before ``os.replace``, and between the best checkpoint's save and ``last.ckpt``'s at the end of
  the same epoch (before and after the older best file is removed).
- ``last.ckpt`` always holds the last save that completed: a kill inside a save keeps the previous
  state, and the half-written ``.<name>.partial`` left behind is never taken for a checkpoint;
  ``--ckpt_path last`` resumes from ``last.ckpt`` at its step, and the resumed run rewrites the
  partial file when it repeats that save, so none is left at the end.
- Each resumed process goes through the same events as the uninterrupted run did from that step
  on (same saves, same order), and the run ends with the uninterrupted run's weights, bit for bit,
  and its best checkpoint file names.

The kill points are drawn from ``random.Random(SEED)``; a failure names the seed, and
``FAULTS_SEED=<seed>`` replays it. ``FAULTS_KILLS=<n>`` kills more often (each kill costs a process
start, about 10 s here).
"""

import importlib
import json
import os
import random
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import copy_template, run_python

SEED = int(os.environ.get("FAULTS_SEED", "1729"))
KILLS = int(os.environ.get("FAULTS_KILLS", "12"))
PACKAGE = "faults"  # the package name copier derives from the destination directory's name
# Four epochs of eight steps, a save of last.ckpt every two steps, and a warm-up short enough for
# val/loss to improve over several epochs, so that several best checkpoints are saved.
TRAINING = [
    "--data.init_args.subset=512",
    "--trainer.max_epochs=4",
    "--last_checkpoint.every_n_train_steps=2",
    "--model.init_args.warmup_steps=2",
]
PROCESS_TIMEOUT = 180  # seconds; a process takes 10 to 20 here, most of it importing

# Logs every event a training process passes, and kills the process with SIGKILL at the first one
# named `event` at or after training step `step`. With no event it only logs, for the
# uninterrupted run. Events: after_step (a training step's end); for each checkpoint save, of
# `last` or `best`: starting, writing (half of the bytes written into the temporary file), replacing
# (the temporary file complete, before os.replace) and saved.
CHAOS = textwrap.dedent(
    """
    import io
    import json
    import os
    import signal
    from pathlib import Path

    import torch
    from lightning.pytorch import Callback


    class Chaos(Callback):
        def __init__(self, log: str, event: str | None = None, step: int = 0) -> None:
            self.path, self.event, self.step = log, event, step
            self.saving = None  # (kind, step) of the checkpoint save under way

        def record(self, *entry) -> None:
            with open(self.path, "a") as file:
                file.write(json.dumps(entry) + "\\n")

        def reached(self, event: str, step: int) -> bool:
            self.record(event, step)
            return event == self.event and step >= self.step

        def on_fit_start(self, trainer, pl_module) -> None:
            checkpoint_io = trainer.strategy.checkpoint_io
            save_checkpoint, save, replace = checkpoint_io.save_checkpoint, torch.save, os.replace

            def chaotic_save_checkpoint(checkpoint, path, storage_options=None):
                kind = "best" if Path(path).name.startswith("best-") else "last"
                step = checkpoint["global_step"]
                if self.reached(f"starting:{kind}", step):
                    die()
                self.saving = (kind, step)
                try:
                    save_checkpoint(checkpoint, path, storage_options=storage_options)
                finally:
                    self.saving = None
                if self.reached(f"saved:{kind}", step):
                    die()

            def chaotic_save(obj, file, *args, **kwargs):
                if self.saving and self.reached(f"writing:{self.saving[0]}", self.saving[1]):
                    whole = io.BytesIO()
                    save(obj, whole, *args, **kwargs)
                    file.write(whole.getvalue()[: whole.tell() // 2])
                    file.flush()
                    die()
                save(obj, file, *args, **kwargs)

            def chaotic_replace(source, destination, *args, **kwargs):
                if self.saving and str(source).endswith(".partial"):
                    if self.reached(f"replacing:{self.saving[0]}", self.saving[1]):
                        die()
                replace(source, destination, *args, **kwargs)

            checkpoint_io.save_checkpoint = chaotic_save_checkpoint
            torch.save, os.replace = chaotic_save, chaotic_replace

        def on_train_start(self, trainer, pl_module) -> None:
            self.record("start", trainer.global_step, str(trainer.ckpt_path))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if self.reached("after_step", trainer.global_step):
                die()


    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)
    """
)

# The kinds of kill point every plan includes, whatever the seed: the event, and whether it must be
# at the end of an epoch that saved a best checkpoint.
REQUIRED = {
    "after a training step": ("after_step", False),
    "inside torch.save of last.ckpt": ("writing:last", False),
    "before os.replace of last.ckpt": ("replacing:last", False),
    "inside torch.save of a best checkpoint": ("writing:best", True),
    "before os.replace of a best checkpoint": ("replacing:best", True),
    "after a best save, before the older best file is removed": ("saved:best", True),
    "after a best save, as the same epoch's last.ckpt save starts": ("starting:last", True),
}

Event = tuple[str, int]


def _fit(project: Path, run_name: str, log: str, kill_at: Event | None = None, resume: bool = False):
    init_args = {"log": log} | ({"event": kill_at[0], "step": kill_at[1]} if kill_at else {})
    chaos = json.dumps({"class_path": "chaos.Chaos", "init_args": init_args})
    resuming = ["--ckpt_path", "last"] if resume else []
    words = ["fit", *TRAINING, f"--trainer.callbacks+={chaos}", *resuming, "--run_name", run_name]
    return run_python(project, "-m", PACKAGE, *words, timeout=PROCESS_TIMEOUT)


def _events(log: Path) -> tuple[list, list[Event]]:
    """The process's start entries, and the events it passed, in order."""
    entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return [e for e in entries if e[0] == "start"], [tuple(e) for e in entries if e[0] != "start"]


def _plan(timeline: list[Event], rng: random.Random) -> list[int]:
    """KILLS indices into the timeline, increasing, one of each REQUIRED kind among them; all after
    the first save of last.ckpt, so that every kill leaves a checkpoint to resume from."""
    first_save = next(index for index, (event, _) in enumerate(timeline) if event == "saved:last")
    candidates = range(first_save, len(timeline))
    best_steps = {step for event, step in timeline if event == "saved:best"}
    chosen = set()
    for kind, (name, at_best) in REQUIRED.items():
        fitting = [
            index
            for index in candidates
            if timeline[index][0] == name and (not at_best or timeline[index][1] in best_steps)
        ]
        assert fitting, f"the uninterrupted run has no event {kind}: {timeline}"
        chosen.add(rng.choice(fitting))
    while len(chosen) < KILLS:
        chosen.add(rng.choice(candidates))
    return sorted(chosen)


def _best(run_dir: Path) -> list[str]:
    return sorted(path.name for path in run_dir.glob("best-*.ckpt"))


@pytest.mark.slow
def test_a_run_killed_at_random_points_ends_as_one_never_killed(tmp_path, monkeypatch):
    project = copy_template(tmp_path / PACKAGE)
    monkeypatch.syspath_prepend(str(project / "src"))  # as run_python gives it to the project's processes
    read_checkpoint = importlib.import_module(f"{PACKAGE}.framework.runs.checkpoints").read_checkpoint
    (project / "chaos.py").write_text(CHAOS)
    (project / "events").mkdir()

    result = _fit(project, "U", "events/U.jsonl")
    assert result.returncode == 0, result.stderr[-3000:]
    _, timeline = _events(project / "events" / "U.jsonl")
    assert len(set(timeline)) == len(timeline), f"an event repeats at one step: {timeline}"
    plan = _plan(timeline, random.Random(SEED))

    run_dir = project / "checkpoints" / "V"
    saved = -1  # the timeline index of the save that last.ckpt holds (-1: none yet)
    kills = 0
    for number, kill_index in enumerate([*plan, None]):
        kill_at = timeline[kill_index] if kill_index is not None else None
        where = f"FAULTS_SEED={SEED}, process {number}, kill point {kill_at}"
        log = f"events/V-{number:02d}.jsonl"
        result = _fit(project, "V", log, kill_at, resume=number > 0)
        code = 0 if kill_at is None else -9  # -9: ended by SIGKILL
        assert result.returncode == code, f"{where}: exit {result.returncode}\n{result.stderr[-3000:]}"
        kills += result.returncode == -9

        # It resumed from last.ckpt, at its step, and then passed the same events as the run that
        # was never killed, up to its kill point.
        starts, passed = _events(project / log)
        if number > 0:
            resumed_from = [(step, Path(project, path).resolve()) for _, step, path in starts]
            # (A run resumed from its final state has nothing left to train, and does not start.)
            finished = saved == len(timeline) - 1
            last = [] if finished else [(timeline[saved][1], (run_dir / "last.ckpt").resolve())]
            assert resumed_from == last, where
        end = len(timeline) if kill_index is None else kill_index + 1
        assert passed == timeline[saved + 1 : end], where
        if kill_at is None:
            break

        # Every checkpoint file loads; last.ckpt holds the last save that completed.
        unreadable = []
        for path in run_dir.rglob("*.ckpt"):
            try:
                read_checkpoint(path)
            except ValueError as error:
                unreadable.append(str(error))
        assert unreadable == [], where
        saved = max(index for index in range(kill_index + 1) if timeline[index][0] == "saved:last")
        assert read_checkpoint(run_dir / "last.ckpt")["global_step"] == timeline[saved][1], where

        # A kill inside a save leaves its temporary file, and never a checkpoint of that name.
        phase, kind = kill_at[0].split(":") if ":" in kill_at[0] else (kill_at[0], None)
        if phase in ("writing", "replacing"):
            partials = list(run_dir.glob(f".{kind}*.ckpt.partial"))
            assert partials, f"{where}: no temporary file left: {sorted(os.listdir(run_dir))}"
            if phase == "writing":  # the one this kill left is half written: loading it would fail
                with pytest.raises(ValueError):
                    read_checkpoint(max(partials, key=lambda path: path.stat().st_mtime_ns))

    assert kills == len(plan) >= KILLS, f"FAULTS_SEED={SEED}"
    leftovers = sorted(path.name for path in run_dir.glob("*.partial"))
    assert leftovers == [], f"FAULTS_SEED={SEED}"
    expected = read_checkpoint(project / "checkpoints" / "U" / "last.ckpt")["state_dict"]
    weights = read_checkpoint(run_dir / "last.ckpt")["state_dict"]
    assert weights.keys() == expected.keys()
    differing = [name for name in expected if not torch.equal(weights[name], expected[name])]
    assert differing == [], f"FAULTS_SEED={SEED}: weights differ from the uninterrupted run's"
    assert _best(run_dir) == _best(project / "checkpoints" / "U"), f"FAULTS_SEED={SEED}"
