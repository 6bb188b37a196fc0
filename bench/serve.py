"""Benchmark: the generated project's ``serve`` over HTTP, against ``predict`` on the same rows.

Generates a project from this template (default answers), trains its default config for two
epochs, writes 270 rows of digits' test split as a CSV file, then:

- ``predict``: ``python -m bench_proj predict --inputs rows.csv``, the whole command (start-up
  included), and the same rows through the model in this process, one at a time and as one batch;
- ``serve``: ``python -m bench_proj serve`` on 127.0.0.1, started twice, without batching
  (``--max_batch_size 1``) and with LitServe's dynamic batching (``--max_batch_size 8``), each
  asked by 1 and by 8 concurrent clients, ``--requests`` requests each (one row a request), after a
  warm-up. Every answer is checked against ``predict``'s row for the same input.

Prints requests per second and the latency's p50 and p99 for each, then summary lines:

    serve_rps[batch=1,clients=8]=...   serve_p99_ms[batch=8,clients=8]=...
    predict_rows_per_s[in_process]=...

Client and server share the machine's cores: on 2 cores, the 8 client threads take CPU from the
server, so this measures the whole loop on one machine, not the server alone.

    python bench/serve.py [--requests 200] [--template GIT_REF] [--keep DIR]
"""

import argparse
import csv
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from run import PACKAGE, generate

WARM_UP = 20
START_LIMIT_S = 180


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(url: str, body: dict) -> tuple[float, dict]:
    """One request's latency in seconds, and its answer."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    return time.perf_counter() - start, answer


def start_server(project: Path, env: dict, checkpoint: Path, batch: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", PACKAGE, "serve", f"--ckpt_path={checkpoint}", f"--port={port}"]
    command += [f"--max_batch_size={batch}", "--batch_timeout=0.005"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    process = subprocess.Popen(command, cwd=project, env=env, start_new_session=True, **quiet)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return process, f"{url}/predict"
        except OSError:
            time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    sys.exit(f"error: the server did not start in {START_LIMIT_S} s")


def load(url: str, rows: list[dict], expected: list[str], clients: int, requests: int) -> dict:
    """``clients`` threads sending ``requests`` one-row requests each; every answer checked."""

    def client(number: int) -> list[float]:
        latencies = []
        for n in range(requests):
            index = (number * requests + n) % len(rows)
            latency, answer = post(url, {"rows": [rows[index]]})
            assert answer["predictions"][0]["class"] == expected[index], (index, answer)
            latencies.append(latency)
        return latencies

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))  # warm-up
        start = time.perf_counter()
        latencies = [latency for result in pool.map(client, range(clients)) for latency in result]
        elapsed = time.perf_counter() - start
    quantiles = statistics.quantiles(latencies, n=100)
    return {"rps": len(latencies) / elapsed, "p50_ms": 1000 * quantiles[49], "p99_ms": 1000 * quantiles[98]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per client")
    parser.add_argument("--template", default="HEAD", help="the template's git ref to generate from")
    parser.add_argument("--keep", type=Path, help="keep the project and runs in this directory")
    args = parser.parse_args()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="bench-serve-"))
    workdir.mkdir(parents=True, exist_ok=True)
    project = generate(workdir, args.template)
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}

    def cli(*words: str) -> float:
        start = time.perf_counter()
        command = [sys.executable, "-m", PACKAGE, *words]
        subprocess.run(command, cwd=project, env=env, check=True, capture_output=True)
        return time.perf_counter() - start

    cli("fit", "--run_name=served", "--trainer.max_epochs=2")
    checkpoint = project / "checkpoints" / "served" / "last.ckpt"
    cli("predict", f"--ckpt_path={checkpoint}")
    [split] = (checkpoint.parent).glob("predict-*/predictions.csv")
    with split.open(newline="") as file:
        predicted = list(csv.DictReader(file))

    sys.path.insert(0, str(project / "src"))
    from sklearn.datasets import load_digits

    pixels = (load_digits().data / 16.0).astype("float32")
    rows = [{f"feature {j}": float(v) for j, v in enumerate(pixels[int(row["row"])])} for row in predicted]
    expected = [row["predicted"] for row in predicted]
    inputs = project / "rows.csv"
    with inputs.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    command_s = cli("predict", f"--ckpt_path={checkpoint}", f"--inputs={inputs}")

    import torch
    from bench_proj.framework.serving import Predictor

    torch.set_num_threads(1)
    predictor = Predictor(checkpoint)
    start = time.perf_counter()
    for row in rows:
        predictor.answers(predictor.predict(predictor.inputs({"rows": [row]})))
    one_at_a_time = len(rows) / (time.perf_counter() - start)
    start = time.perf_counter()
    answers = predictor.answers(predictor.predict(predictor.inputs({"rows": rows})))
    batched = len(rows) / (time.perf_counter() - start)
    assert [answer["class"] for answer in answers] == expected

    results = {}
    for batch in (1, 8):
        process, url = start_server(project, env, checkpoint, batch)
        try:
            for clients in (1, 8):
                results[batch, clients] = load(url, rows, expected, clients, args.requests)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)

    print(f"predict --inputs rows.csv ({len(rows)} rows), whole command: {command_s:.1f} s")
    print(f"in process, one row at a time: {one_at_a_time:,.0f} rows/s; as one batch: {batched:,.0f} rows/s")
    print(f"{'max_batch_size':>14} {'clients':>8} {'requests/s':>11} {'p50 ms':>8} {'p99 ms':>8}")
    for (batch, clients), result in results.items():
        rps, p50, p99 = result["rps"], result["p50_ms"], result["p99_ms"]
        print(f"{batch:>14} {clients:>8} {rps:>11.0f} {p50:>8.1f} {p99:>8.1f}")
    for (batch, clients), result in results.items():
        print(f"serve_rps[batch={batch},clients={clients}]={result['rps']:.0f}")
        print(f"serve_p99_ms[batch={batch},clients={clients}]={result['p99_ms']:.1f}")
    print(f"predict_rows_per_s[in_process]={batched:.0f}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
