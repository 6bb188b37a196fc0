"""The process that holds a training run's Weights & Biases run (see ``tracking.py``).

It imports wandb and starts wandb's service at once, then reads one JSON message a line from its
standard input: first the arguments of ``wandb.init``, then what to log. A command that ends before
it logs anything makes no run. At a ``finish`` message it finishes the run with the exit code
given; when the input ends without one (the training process failed or was killed), it finishes
the run as failed. Run as a script, so that it imports wandb and nothing of the project, torch or Lightning.
"""

import gc
import json
import os
import signal
import sys

# The script's directory holds the project's utils modules: none of them may shadow what wandb imports.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [path for path in sys.path if os.path.abspath(path or os.curdir) != HERE]


def main() -> None:
    # Ctrl-C and a scheduler's SIGTERM reach the whole process group; the training process stops
    # in its own time, and its end (the end of this input) ends the run here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Imported with the garbage collector off, and what it made frozen (as ``__main__.py`` does):
    # the command waits for this process to end, and its end is then 0.2 s shorter.
    gc.disable()
    import wandb

    gc.freeze()
    gc.enable()

    wandb.setup()  # starts wandb's service, while the training process gets ready
    init = json.loads(sys.stdin.readline() or '{"kind": "finish"}')
    if init.get("kind") == "finish":  # the command ended before it logged anything: no run
        return
    run = wandb.init(**init)
    run.define_metric("trainer/global_step")
    run.define_metric("*", step_metric="trainer/global_step", step_sync=True)
    exit_code = 1
    for line in sys.stdin:
        message = json.loads(line)
        step = {} if message.get("step") is None else {"trainer/global_step": message["step"]}
        if message["kind"] == "metrics":
            run.log({**message["values"], **step})
        elif message["kind"] == "hyperparameters":
            run.config.update(message["values"], allow_val_change=True)
        elif message["kind"] == "images":
            run.log({message["key"]: [wandb.Image(path) for path in message["paths"]], **step})
        elif message["kind"] == "finish":
            exit_code = message["exit_code"]
            break
    run.finish(exit_code=exit_code)


if __name__ == "__main__":
    main()
