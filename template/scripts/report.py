"""Compare the runs in ``experiments.jsonl``: a table of every run and a chart of their metrics.

Usage:
    python scripts/report.py                         # experiments.jsonl -> reports/
    python scripts/report.py --record other.jsonl --output_dir reports/other

One row per run name: its latest ``fit`` line (model, dataset, seed, the hyper-parameters that
differ between runs, epochs, the best value of the monitored metric and its epoch, wall time,
commit) and its latest ``test`` line (the test metrics). Prints the table, and writes
``experiments.csv`` and ``experiments.png`` (the best validation value and the test metrics of
every run, losses left out) into ``--output_dir``.
"""

import argparse
import csv
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RUN = ("run_name", "model", "dataset", "seed")
RESULT = ("epochs", "monitor", "best_value", "best_epoch")


def read_record(path: Path) -> list[dict[str, Any]]:
    """The record's lines, with an error naming the file and line of any that is not JSON."""
    if not path.is_file():
        raise FileNotFoundError(f"no experiment record {path}: fit or test a model first")
    lines = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}, is not JSON: {error}") from None
    return lines


def compare(lines: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The table's columns, and one row per run name in the order the runs first appear, from
    the run's latest fit and latest test."""
    rows: dict[str, dict[str, Any]] = {}
    for line in lines:
        row = rows.setdefault(str(line.get("run_name")), {})
        if line.get("stage") == "fit":
            row.update({key: line.get(key) for key in (*RUN, *RESULT, "wall_time_s", "git_commit")})
            row["hparams"] = _flatten(line.get("hparams") or {})
        elif line.get("stage") == "test":
            row.setdefault("run_name", line.get("run_name"))
            row.update(line.get("test") or {})
    table = list(rows.values())
    hparams = sorted({key for row in table for key in row.get("hparams", {})})
    differing = [
        key for key in hparams if len({json.dumps(row.get("hparams", {}).get(key)) for row in table}) > 1
    ]
    for row in table:
        row.update({key: row.get("hparams", {}).get(key) for key in differing})
    tests = sorted({key for row in table for key in row if key.startswith("test/")})
    return [*RUN, *differing, *RESULT, *tests, "wall_time_s", "git_commit"], table


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    """Grouped horizontal bars: for each run, its best validation value and its test metrics."""
    from matplotlib.figure import Figure  # imported here: only this script's chart needs it

    series: dict[str, list[float]] = {}
    for index, row in enumerate(rows):
        values = {f"best {row['monitor']}": row.get("best_value")} if row.get("monitor") else {}
        values |= {key: value for key, value in row.items() if key.startswith("test/") and "loss" not in key}
        for name, value in values.items():
            if value is not None:
                series.setdefault(name, [float("nan")] * len(rows))[index] = value
    groups = max(1, len(series))
    figure = Figure(figsize=(8, 1.5 + 0.3 * len(rows) * groups), layout="constrained")
    axes = figure.subplots()
    height = 0.8 / groups
    for offset, (name, values) in enumerate(series.items()):
        positions = [index + (offset - (groups - 1) / 2) * height for index in range(len(rows))]
        axes.barh(positions, values, height, label=name)
    axes.set_yticks(range(len(rows)), [row["run_name"] for row in rows])
    axes.invert_yaxis()
    axes.set(xlabel="value", title="runs in the experiment record")
    figure.legend(loc="outside lower center", ncols=min(4, groups))
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Print the table, write the CSV and the chart; return the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, default=Path("experiments.jsonl"))
    parser.add_argument("--output_dir", type=Path, default=Path("reports"))
    args = parser.parse_args(argv)
    try:
        names, rows = compare(read_record(args.record))
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))

    table = Table(title=f"{len(rows)} runs in {args.record}")
    for name in names:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(row.get(name)) for name in names))
    Console().print(table)

    args.output_dir.mkdir(parents=True, exist_ok=True)
    with (args.output_dir / "experiments.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, names, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    chart(rows, args.output_dir / "experiments.png")
    print(f"wrote {args.output_dir / 'experiments.csv'} and {args.output_dir / 'experiments.png'}")
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
