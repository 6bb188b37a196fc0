"""Compare the runs in ``experiments.jsonl``: a table, a chart of their metrics, their training curves.

Usage:
    python scripts/report.py                              # every run -> table, reports/experiments.*
    python scripts/report.py --dataset DigitsDataModule --since 3d --where lr=0.01 --sort test/acc
    python scripts/report.py --curves run-a run-b         # -> reports/curves.png

One row per run name, from its latest ``fit`` line (a resumed run has one per part: ``parts``
counts them) and its latest ``test`` line. The table fits the terminal: beside the run, its
status, the best value of its monitored metric (the metric named in each cell when the runs
monitor different ones) and the test metrics with the checkpoint they are of (``tested``), it
shows the columns that differ between the runs, as many as fit, and names the others in one
line below. Writes every
column to ``experiments.csv`` and charts the best values and test metrics (losses left out) in
``experiments.png``, both in ``--output_dir``.

``--curves`` draws the train and validation curves of the runs named, from the CSV logger's
``<runs_dir>/<run>/metrics.csv`` (and ``resumed-*/metrics.csv``, one per resumed part).

In a notebook, ``load`` gives the record as a pandas DataFrame, one row per line, the
hyper-parameters as columns (nested ones dotted: ``network.dropout``) and the test metrics too::

    load = runpy.run_path("scripts/report.py")["load"]
    load("experiments.jsonl").query("stage == 'fit'")
"""

import argparse
import json
import re
import sys
from datetime import datetime, timedelta
from functools import partial
from math import inf, nan
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .runs.experiments import read_lines

# Columns the table shows in a column of its own (run, status, best), or not at all.
APART = {"run_name", "status", "parts", "monitor", "best_value", "best_epoch", "time", "stage", "classes"}
APART |= {"best_checkpoint", "last_checkpoint", "checkpoint", "git_dirty"}  # git_commit ends in +dirty
TESTED = "tested"  # the column naming the checkpoint that the test metrics are of
FIRST = ("model", "dataset", "seed")
LAST = ("epochs", "steps", "effective_batch_size", "wall_time_s", "git_commit")
LOWER_IS_BETTER = ("loss", "error", "mae", "mse")
RELATIVE = re.compile(r"(\d+(?:\.\d+)?)([mhdw])")
UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# The keys of a line that the report needs, which every version of the record has written.
REQUIRED = ("time", "run_name", "stage")
FIT_REQUIRED = ("monitor", "best_value", "best_epoch")


def read_record(path: Path) -> list[dict[str, Any]]:
    """The record's lines; one that cannot be read is skipped with a warning naming it and what is
    wrong, and a record of such lines only is refused."""
    if not path.is_file():
        raise FileNotFoundError(f"no experiment record {path}: fit or test a model first")
    skipped: list[int] = []

    def skip(number: int, problem: str) -> None:
        print(f"warning: {path} line {number} {problem}; skipped", file=sys.stderr)
        skipped.append(number)

    lines = read_lines(path, skipped=skip, check=_problem)
    if skipped and not lines:
        raise ValueError(f"{path}: no line can be read; fix or delete those named above")
    return lines


def _problem(line: dict[str, Any]) -> str | None:
    """What is wrong with a line of the record for the report, if anything."""
    keys = REQUIRED + (FIT_REQUIRED if line.get("stage") == "fit" else ())
    if missing := [key for key in keys if key not in line]:
        return f"has no {', '.join(missing)}"
    for key in ("run_name", "stage", "monitor", "status"):
        # The table groups runs by name and prints the others as text; a run has a name and a stage.
        if not isinstance(line.get(key), str | None) or (key in REQUIRED and line[key] is None):
            return f"has a {key} that is not text: {json.dumps(line[key])}"
    for key in ("best_value", "best_epoch"):
        if not _number_or_null(line.get(key)):
            return f"has a {key} that is not a number: {json.dumps(line[key])}"
    tests = line.get("test")
    if tests is not None and not (isinstance(tests, dict) and all(map(_number_or_null, tests.values()))):
        return f"has test metrics that are not numbers: {json.dumps(tests)}"
    try:
        datetime.fromisoformat(str(line["time"]))
    except ValueError:
        return f"has a time that is not an ISO time: {json.dumps(line['time'])}"
    return None


def _number_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def load(record: str | Path = "experiments.jsonl") -> pd.DataFrame:
    """The record, one row per line: ``hparams`` and ``test`` flattened into columns of their own
    (``lr``, ``network.dropout``, ``test/acc``) unless a record field has that name already."""
    frame = pd.json_normalize(read_record(Path(record))).drop(columns="test", errors="ignore")
    short = {name: name.split(".", 1)[1] for name in frame if name.startswith(("hparams.", "test."))}
    return frame.rename(columns={name: new for name, new in short.items() if new not in frame})


def runs_of(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per fitted run: its latest fit line, with the number of its ``parts``, and its latest
    test metrics; in the order the runs last wrote a fit line."""
    fits = frame[frame["stage"] == "fit"]
    runs = fits.drop_duplicates("run_name", keep="last").set_index("run_name")
    # A fit line lists the run's parts so far; one from before it did counts the run's fit lines.
    lines = fits.groupby("run_name").size()
    listed = runs["parts"] if "parts" in runs else pd.Series(None, runs.index, dtype=object)
    runs["parts"] = [len(parts) if isinstance(parts, list) else lines[run] for run, parts in listed.items()]
    # v0.1.0 wrote a fit line, without a status, only when a fit finished.
    runs["status"] = runs["status"].fillna("finished") if "status" in runs else "finished"
    tests = [name for name in frame if name.startswith("test/")]
    latest = frame[frame["stage"] == "test"].drop_duplicates("run_name", keep="last").set_index("run_name")
    paths = latest.get("checkpoint", pd.Series(None, latest.index, dtype=object))
    runs = runs.drop(columns=tests).join(latest[tests]).join(paths.rename(TESTED))
    unnamed = pd.Series(None, runs.index, dtype=object)
    kept = [runs.get(name, unnamed) for name in ("best_checkpoint", "last_checkpoint")]
    runs[TESTED] = [_tested(*paths) for paths in zip(runs[TESTED], *kept, strict=True)]
    return runs.reset_index()


def _tested(path: Any, best: Any, last: Any) -> str | None:
    """The checkpoint of a run's test metrics: ``best`` or ``last`` if it is the one the run's fit
    line names so, else its file's name."""
    if not isinstance(path, str):
        return None
    name = Path(path).name
    kept = {"last": last, "best": best}
    return {Path(file).name: kind for kind, file in kept.items() if isinstance(file, str)}.get(name, name)


def since(text: str) -> datetime:
    """An ISO date or time (local unless it says otherwise), or a time ago: 30m, 2h, 3d, 1w."""
    if relative := RELATIVE.fullmatch(text):
        amount, unit = relative.groups()
        return datetime.now().astimezone() - timedelta(**{UNITS[unit]: float(amount)})
    try:
        return datetime.fromisoformat(text).astimezone()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO date or time nor 30m, 2h, 3d or 1w"
        ) from None


def condition(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value")
    return key, value


def matches(value: Any, wanted: str) -> bool:
    """Whether a cell holds ``wanted``, read as JSON when it is (0.01, 1, true, null, [64, 32])."""
    try:
        parsed = json.loads(wanted)
    except json.JSONDecodeError:
        parsed = wanted
    if parsed is None:
        return _missing(value)
    return value == parsed or _text(value) == wanted


def best_first(runs: pd.DataFrame, key: str) -> pd.DataFrame:
    """Lowest first for a loss or an error, highest otherwise. ``best_value`` is of each run's own
    monitor: the runs of a monitor are ordered together, by its name, in the order of their first."""
    if key != "best_value":
        return _sorted(runs, key, key)
    by_monitor = runs.groupby(runs["monitor"].fillna(""), sort=False)
    return pd.concat([_sorted(group, key, monitor) for monitor, group in by_monitor])


def _sorted(runs: pd.DataFrame, key: str, name: str) -> pd.DataFrame:
    lower_is_better = any(word in name for word in LOWER_IS_BETTER)
    order = {"ascending": lower_is_better, "na_position": "last", "kind": "stable"}
    return runs.sort_values(key, key=_comparable, **order)


def _comparable(column: pd.Series) -> pd.Series:
    """A column as numbers where every value is one, and as text where not (a precision of 32 in one
    run and "bf16-mixed" in another, lists), so that values of different types can be ordered."""
    numbers = pd.to_numeric(column, errors="coerce")
    if numbers.notna().sum() == (~column.map(_missing)).sum():
        return numbers
    return column.map(lambda value: None if _missing(value) else _text(value))


def table(runs: pd.DataFrame, console: Console) -> tuple[Table, str]:
    """The table of the runs, as wide as the console at most, and a line naming what it leaves out:
    the columns that are the same in every run, with their value, and those with no room left.
    A column set in no run (a ``network`` that no run's model takes) is left out unnamed."""
    columns = {
        "run": runs["run_name"].map(str),
        # A resumed run's parts on a line of their own, so that they widen no column.
        "status": [
            f"{status}\n({parts} parts)" if parts > 1 else status
            for status, parts in zip(runs["status"], runs["parts"], strict=True)
        ],
        **best_column(runs),
    }
    metrics = [name for name in runs if name.startswith("test/")]
    tests = [name for name in metrics if runs[name].notna().any()]  # of the runs shown
    if runs[TESTED].notna().any():  # the checkpoint the test metrics are of, always beside them
        columns[TESTED] = runs[TESTED].map(_text)
    hparams = [name for name in runs if name not in {*APART, *FIRST, *LAST, *metrics, TESTED}]
    configuration = [name for name in (*FIRST, *hparams, *LAST) if name in runs]
    cells = {name: runs[name].map(partial(_text, float_format=".4f")) for name in tests}
    cells |= {name: runs[name].map(_text) for name in configuration}
    if "git_commit" in cells:
        cells["git_commit"] = cells["git_commit"].str.replace(r"^(\w{7})\w*", r"\1", regex=True)
    # The same in every run only where every run has it: a key of one run's model alone differs.
    present = [name for name in configuration if (cells[name] != "").any()]
    same = [name for name in present if (cells[name] != "").all() and cells[name].nunique() == 1]
    differing = [name for name in present if name not in same]
    headers = {name: _header(name, max(6, cells[name].str.len().max())) for name in cells}
    widths = {name: max(*cells[name].str.len(), *map(len, headers[name].splitlines())) for name in cells}
    unbounded = console.options.update_width(10 * console.width)  # for the width each column wants

    def fits(names: list[str]) -> bool:
        trial = columns | {headers[name]: cells[name] for name in names}
        return console.measure(_table(trial), options=unbounded).maximum <= console.width

    # The test metrics first, then as many differing columns as fit: what the runs were given
    # (model, data, hyper-parameters) before what they took (epochs, time), the narrowest first.
    chosen: list[str] = []
    for name in [*tests, *sorted(differing, key=lambda name: (name in LAST, widths[name]))]:
        if fits([*chosen, name]):
            chosen.append(name)
    too_wide = [name for name in [*tests, *differing] if name not in chosen]
    columns |= {headers[name]: cells[name] for name in [*tests, *differing] if name in chosen}
    left_out = []
    if same:
        left_out.append(
            "the same in every run: " + ", ".join(f"{name}={cells[name].iloc[0]}" for name in same)
        )
    if too_wide:
        left_out.append(f"no room in {console.width} columns: " + ", ".join(too_wide))
    return _table(columns), f"Not shown, {'; '.join(left_out)}." if left_out else ""


def best_column(runs: pd.DataFrame) -> dict[str, list[str]]:
    """The best value of each run's monitored metric and its epoch; the metric's name in the
    header when every run monitors the same one, in each cell when not."""
    monitors = runs["monitor"].fillna("").map(str)
    shared = monitors.iloc[0] if monitors.nunique() == 1 else None
    cells = [
        "" if _missing(value) else f"{'' if shared is not None else monitor + ' '}{value:.4f} @ {epoch:.0f}"
        for monitor, value, epoch in zip(monitors, runs["best_value"], runs["best_epoch"], strict=True)
    ]
    return {f"best {shared or ''}".rstrip() + "\n@ epoch": cells}


def _header(name: str, width: int) -> str:
    """``name`` broken after its underscores, dots and slashes into lines of about ``width``, so that a
    long key over short values does not take the room of another column."""
    lines = [""]
    for piece in re.split(r"(?<=[_./])", name):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(lines)


def _table(columns: dict[str, Any]) -> Table:
    grid = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    for header in columns:
        grid.add_column(header, overflow="fold")
    for row in zip(*columns.values(), strict=True):
        grid.add_row(*map(Text, row))
    return grid


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _text(value: Any, float_format: str = ".4g") -> str:
    if _missing(value):
        return ""
    return format(value, float_format) if isinstance(value, float) else str(value)


def chart(runs: pd.DataFrame, path: Path) -> Figure:
    """Grouped horizontal bars: each run's best validation value and test metrics, the value axis
    spanning the values rather than starting at 0, so that 0.93 and 0.98 look apart."""
    series = {}
    if runs["monitor"].nunique() == 1:
        series[f"best {runs['monitor'].iloc[0]}"] = runs["best_value"]
    series |= {name: runs[name] for name in runs if name.startswith("test/") and "loss" not in name}
    # A diverged run's infinite loss is in the table; a bar cannot show it.
    series = {name: values.astype(float).replace([inf, -inf], nan) for name, values in series.items()}
    series = {name: values for name, values in series.items() if values.notna().any()}
    figure = Figure(figsize=(8, 1.5 + 0.35 * len(runs) * max(1, len(series))), layout="constrained")
    axes = figure.subplots()
    height = 0.8 / max(1, len(series))
    for offset, (name, values) in enumerate(series.items()):
        positions = [index + (offset - (len(series) - 1) / 2) * height for index in range(len(runs))]
        bars = axes.barh(positions, values, height, label=name)
        axes.bar_label(bars, fmt="%.4f", padding=2, fontsize=8)
    values = pd.concat(series.values()).dropna() if series else pd.Series([0.0, 1.0])
    # At least 2% of the values' size, so that differences in the fifth decimal do not look large.
    margin = max(0.15 * (values.max() - values.min()), 0.02 * abs(values.max())) or 1
    low = values.min() - margin
    # Room on the right for the bars' labels; no negative axis for metrics that cannot be.
    axes.set_xlim(max(0.0, low) if values.min() >= 0 else low, values.max() + 2 * margin)
    axes.set_yticks(range(len(runs)), runs["run_name"].map(str))
    axes.invert_yaxis()
    axes.set(xlabel="value", title="runs in the experiment record")
    if series:
        figure.legend(loc="outside lower center", ncols=min(4, len(series)))
    figure.savefig(path, dpi=100)
    return figure


def read_metrics(run_dir: Path) -> pd.DataFrame:
    """A run's CSV-logged metrics, its resumed parts joined in time order: a step logged again
    after a resume is the later part's."""
    first = run_dir / "metrics.csv"
    paths = [path for path in [first, *sorted(run_dir.glob("resumed-*/metrics.csv"))] if path.is_file()]
    if not paths:
        raise FileNotFoundError(f"no {first}: the CSV logger writes it (configs/logger/csv.yaml)")
    metrics = pd.read_csv(paths[0])
    for path in paths[1:]:
        part = pd.read_csv(path)
        if not part.empty:
            metrics = pd.concat([metrics[metrics["step"] < part["step"].min()], part], ignore_index=True)
    return metrics


def curves(runs: dict[str, pd.DataFrame], path: Path) -> Figure:
    """One panel per validation metric, a colour per run: validation solid, training dashed (its
    epoch mean where logged, ``train/loss_epoch``), against the training step."""
    names = sorted({name[4:] for metrics in runs.values() for name in metrics if name.startswith("val/")})
    if not names:
        raise ValueError(f"{', '.join(runs)}: no validation metric logged yet")
    figure = Figure(figsize=(4.5 * len(names), 4), layout="constrained")
    for axes, name in zip(figure.subplots(1, len(names), squeeze=False)[0], names, strict=True):
        for color, (run, metrics) in enumerate(runs.items()):
            train = f"train/{name}_epoch" if f"train/{name}_epoch" in metrics else f"train/{name}"
            for column, style, split in ((f"val/{name}", "o-", "val"), (train, "--", "train")):
                if column in metrics:
                    points = metrics[["step", column]].dropna()
                    axes.plot(
                        points["step"], points[column], style, color=f"C{color}", label=f"{run} {split}"
                    )
        axes.set(title=name, xlabel="step")
        axes.legend(fontsize=8)
    figure.savefig(path, dpi=100)
    return figure


def main(argv: list[str] | None = None) -> pd.DataFrame | None:
    """Print the table and write the CSV file and the chart, returning the runs; or with
    ``--curves``, draw the runs' curves."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.curves:
        _write_curves(args, parser)
        return None
    try:
        record = load(args.record)
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    if "stage" not in record or not (record["stage"] == "fit").any():
        parser.error(f"{args.record} holds no fit yet: fit a model first")
    runs = _chosen(runs_of(record), args, parser)
    console = Console()
    grid, left_out = table(runs, console)
    console.print(Text(f"{len(runs)} run{'s' * (len(runs) > 1)} in {args.record}", style="bold"))
    console.print(grid)
    if left_out:
        console.print(left_out, markup=False, highlight=False)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    runs.to_csv(args.output_dir / "experiments.csv", index=False)
    chart(runs, args.output_dir / "experiments.png")
    print(f"wrote {args.output_dir / 'experiments.csv'} and {args.output_dir / 'experiments.png'}")
    return runs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--record", type=Path, default=Path("experiments.jsonl"), help="the record (default: %(default)s)"
    )
    parser.add_argument(
        "--output_dir", type=Path, default=Path("reports"), help="where the files go (default: %(default)s)"
    )
    parser.add_argument("--dataset", help="only the runs on this data module (as in the dataset column)")
    parser.add_argument(
        "--since", type=since, help="only the runs fitted since: an ISO date or time, or 30m, 2h, 3d, 1w ago"
    )
    parser.add_argument(
        "--where",
        type=condition,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only the runs whose KEY (a column: lr, network.dropout, status, parts ...) is VALUE, read as "
        "JSON when it is (0.01, true, null, [256, 128]); repeatable",
    )
    parser.add_argument(
        "--sort",
        metavar="KEY",
        help="order by KEY, best first: lowest first for a name with loss, error, mae or mse in it "
        "(best_value: its monitor's name, the runs of each monitor together), highest first otherwise",
    )
    parser.add_argument(
        "--curves",
        nargs="+",
        metavar="RUN",
        help="instead of the table, draw the train and validation curves of these runs, from their "
        "RUNS_DIR/RUN/metrics.csv, into OUTPUT_DIR/curves.png",
    )
    parser.add_argument(
        "--runs_dir",
        type=Path,
        default=Path("checkpoints"),
        help="where --curves finds the runs (default: %(default)s)",
    )
    return parser


def _write_curves(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    try:
        metrics = {run: read_metrics(args.runs_dir / run) for run in args.curves}
        args.output_dir.mkdir(parents=True, exist_ok=True)
        curves(metrics, args.output_dir / "curves.png")
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    print(f"wrote {args.output_dir / 'curves.png'}")


def _chosen(runs: pd.DataFrame, args: argparse.Namespace, parser: argparse.ArgumentParser) -> pd.DataFrame:
    """The runs that ``--dataset``, ``--since`` and ``--where`` choose, in the order of ``--sort``."""
    if args.dataset:
        runs = runs[runs["dataset"] == args.dataset]
    if args.since:
        # Read as --since reads its argument: a time without its offset is local.
        runs = runs[runs["time"].map(lambda time: datetime.fromisoformat(time).astimezone()) >= args.since]
    for key, value in args.where:
        if key not in runs:
            parser.error(f"--where {key}: no such key; the keys are {', '.join(map(str, runs.columns))}")
        runs = runs[runs[key].map(partial(matches, wanted=value))]
    if runs.empty:
        parser.error(f"no run in {args.record} matches --dataset, --since and --where together")
    if args.sort:
        if args.sort not in runs:
            parser.error(f"--sort {args.sort}: no such key; the keys are {', '.join(map(str, runs.columns))}")
        runs = best_first(runs, args.sort)
    return runs


if __name__ == "__main__":
    main()
