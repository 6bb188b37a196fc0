"""Reading a data file into features and labels, with every value checked as it is read.

A CSV file is a header row and one row per sample. A column of numbers is a numeric feature; a
column of text is a categorical feature, one-hot encoded by ``Preprocessing``; a column that is
not a feature (an identifier, free text, a date) is left out by naming it in ``drop_columns``. An
``.npz`` archive holds numeric arrays, an ``.npy`` file the features alone. Whatever cannot be
trained on stops here, naming the file, the row and the column: a value that is not a number in a
column of numbers, one that is infinite or too large for float32, a column of dates, identifiers
or free text, a ragged or empty file, a label that is not a class. The problems of a file's
columns are reported together, one line each, so that one run names all of them.

A missing value is an empty cell or one of ``MISSING`` (any case), in a column of numbers or of
text alike, and NaN in an array; ``treat_missing`` refuses, drops or imputes them, as the data
module's ``missing`` says. In a column of numbers it is read as NaN.
"""

import csv
import re
import zipfile
from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

# Beyond this a float32 network overflows (squares reach 1e38) or the value is a placeholder
# for a missing one (1e38, 9.99e99); standardised features are far below it.
LARGEST_VALUE = 1e15
# A text column with a different value in more than this share of its rows is an identifier or
# free text, not a category.
MOST_DISTINCT = 0.5
# How a CSV says that a value is missing, besides an empty cell: pandas' spellings, lowercased
# (they are matched in any case), except "None", which is as often a category ("no symptoms").
MISSING = frozenset(("", "na", "n/a", "#n/a", "<na>", "nan", "-nan", "null"))
# The category a missing text value becomes when missing values are imputed.
MISSING_CATEGORY = "missing"
# A text column is one of dates or times when this share of its values are written as one: ISO 8601
# (2024-01-31, 2024-01-31T08:00:00+01:00), day/month/year with / or . (31/01/2024), or a time (08:00).
DATE = re.compile(
    r"\d{4}-\d{1,2}-\d{1,2}([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?)?"
    r"|\d{1,2}[/.]\d{1,2}[/.]\d{2,4}( \d{1,2}:\d{2}(:\d{2})?)?|\d{1,2}:\d{2}(:\d{2})?"
)
MOSTLY_DATES = 0.9
# A file with more problems than this is reported by its first ones.
REPORTED_PROBLEMS = 10
# The delimiters a CSV file may have, told apart on its first characters.
DELIMITERS = ",;\t|"
SNIFFED_CHARACTERS = 65_536
# A CSV file's header is refused past this length, before more of it is read: a file without line
# breaks, or one that is not a CSV file, would otherwise be read whole as the header.
HEADER_CHARACTERS = 1_000_000
# A CSV file is converted to numbers this many rows at a time: its text is never all in memory.
CHUNK_ROWS = 10_000


class DataError(ValueError):
    """A data file, or a value in it, that cannot be trained on."""


@dataclass
class Table:
    """Samples read from a file, before any preprocessing.

    ``numeric`` holds the numeric features, one row per sample (for arrays, any trailing shape);
    ``categorical`` the text features, as strings. ``labels`` are as written in the file: numbers
    or strings, or ``None`` for a file without them. ``rows`` names each sample in messages.
    """

    source: Path
    numeric: np.ndarray
    numeric_names: list[str] = field(default_factory=list)
    categorical: np.ndarray = field(default_factory=lambda: np.empty((0, 0), dtype=str))
    categorical_names: list[str] = field(default_factory=list)
    labels: np.ndarray | None = None
    label_name: str = "label"
    rows: list[str] = field(default_factory=list)
    delimiter: str = ","

    def __len__(self) -> int:
        return len(self.numeric)

    def where(self, index: int, column: str | None = None) -> str:
        """``FILE row N, column C``: where a sample, or one of its values, is."""
        place = f"{self.source} {self.rows[index]}"
        return f"{place}, column {column!r}" if column is not None else place

    def missing(self) -> np.ndarray:
        """Where a feature is missing: one row per sample, one column per feature, the numeric ones
        (flattened) then the text ones."""
        numeric = np.isnan(self.numeric.reshape(len(self), -1))
        if not self.categorical.size:
            return numeric
        return np.hstack([numeric, is_missing(self.categorical)])

    def take(self, indices: np.ndarray) -> "Table":
        """The samples at ``indices``, in that order."""
        return Table(
            self.source,
            self.numeric[indices],
            self.numeric_names,
            self.categorical[indices] if self.categorical.size else self.categorical,
            self.categorical_names,
            None if self.labels is None else self.labels[indices],
            self.label_name,
            [self.rows[i] for i in indices],
            self.delimiter,
        )


def read_table(
    path: Path,
    label_column: str = "label",
    features_key: str = "features",
    labels_key: str = "labels",
    drop_columns: Collection[str] = (),
    only_columns: Collection[str] | None = None,
    missing_advice: str | None = None,
    text_columns: Collection[str] = (),
    required_columns: Collection[str] = (),
) -> Table:
    """The samples of a ``.csv``, ``.npz`` or ``.npy`` file, checked; see the module's docstring.

    The labels are ``label_column`` of a CSV file, or the array ``labels_key`` of an ``.npz``
    archive; the features are the other columns, or the array ``features_key``. Labels are
    optional here; a data module that needs them says so. A CSV file's columns in
    ``drop_columns``, or not in ``only_columns`` if given, are not read. With ``missing_advice``, a
    missing value is one of the problems reported, with that advice. The ``text_columns`` (a text
    model's input) are read as text, free text included; they and the ``required_columns`` must
    be in the file.
    """
    if path.suffix not in (".npy", ".npz", ".csv"):
        raise DataError(f"{path} is not a .npy, .npz or .csv file")
    if not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    if path.suffix == ".csv":
        required = [*text_columns, *required_columns]
        table, problems = _read_csv(
            path, label_column, set(drop_columns), only_columns, set(text_columns), required
        )
    else:
        table, problems = _read_arrays(path, labels_key, features_key), []
    problems += numeric_problems(table)
    if missing_advice is not None:
        problems += missing_problems(table, missing_advice)
    refuse(path, problems)
    return table


def refuse(source: Path, problems: Sequence[str]) -> None:
    """Raise one ``DataError`` for all of ``problems``, each a message that begins with ``source``:
    that message for one, else a line for each of the first ``REPORTED_PROBLEMS``."""
    if len(problems) == 1:
        raise DataError(problems[0])
    if problems:
        shown = [problem.removeprefix(str(source)).lstrip(", ") for problem in problems[:REPORTED_PROBLEMS]]
        first = f", the first {len(shown)} of them" if len(shown) < len(problems) else ""
        raise DataError("\n  ".join([f"{source} has {len(problems)} problems{first}:", *shown]))


def _read_arrays(path: Path, labels_key: str, features_key: str) -> Table:
    try:
        if path.suffix == ".npy":
            features, labels = np.load(path), None
        else:
            with np.load(path) as archive:
                if features_key not in archive.files:
                    raise DataError(f"{path} has no array {features_key!r}; it holds {archive.files}")
                features = archive[features_key]
                labels = archive[labels_key] if labels_key in archive.files else None
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as error:
        if isinstance(error, DataError):
            raise
        raise DataError(f"{path} is not a readable NumPy {path.suffix} file") from None
    if len(features) == 0:
        raise DataError(f"{path} holds no samples")
    if features.ndim < 2:
        raise DataError(f"{path}: {features_key} must hold one row per sample, got shape {features.shape}")
    if not np.issubdtype(features.dtype, np.number) or np.iscomplexobj(features):
        raise DataError(f"{path}: {features_key} must hold real numbers, got {features.dtype}")
    if labels is not None and len(labels) != len(features):
        raise DataError(f"{path} holds {len(features)} samples but {len(labels)} {labels_key}")
    name = "feature {}" if path.suffix == ".npy" else features_key + "[{}]"
    names = [name.format(i) for i in range(int(np.prod(features.shape[1:])))]
    rows = [f"sample {i}" for i in range(len(features))]
    return Table(path, features.astype(np.float64), names, labels=labels, label_name=labels_key, rows=rows)


def _read_csv(
    path: Path,
    label_column: str,
    dropped: set[str],
    only: Collection[str] | None,
    free_text: set[str],
    required: list[str],
) -> tuple[Table, list[str]]:
    with csv_text(path):
        with path.open(newline="", encoding="utf-8-sig") as file:
            check_header_length(path, file)
            file.seek(0)
            dialect = _dialect(file.read(SNIFFED_CHARACTERS))
            file.seek(0)
            header, numbers, text, row_numbers = _read_numbers(path, csv.reader(file, dialect))
        if unknown := sorted(dropped - set(header)):
            raise DataError(f"data.init_args.drop_columns names {unknown}, not columns of {path}: {header}")
        if label_column in dropped:
            raise DataError(f"data.init_args.drop_columns names {label_column!r}, the label column")
        if absent := [name for name in required if name not in header]:
            raise DataError(f"{path} has no column {absent[0]!r}; its columns are {header}")
        features = [
            i
            for i, name in enumerate(header)
            if name != label_column and name not in dropped and (only is None or name in only)
        ]
        if not features and only is None:  # a file to predict is told the columns it lacks
            raise DataError(f"{path} has no feature columns besides {label_column!r}")
        label = header.index(label_column) if label_column in header else None
        counts, present = text.sum(axis=0), (~np.isnan(numbers) | text).sum(axis=0)
        textual = [i for i in features if counts[i] * 2 > present[i] or header[i] in free_text]  # mostly text
        wrong = [i for i in features if counts[i] and i not in textual]
        text_labels = label is not None and bool(counts[label])
        read_as_text = [*wrong, *textual, *([label] if text_labels else [])]
        with path.open(newline="", encoding="utf-8-sig") as file:
            values = _read_text(csv.reader(file, dialect), read_as_text, len(row_numbers))
    rows = [f"row {number}" for number in row_numbers]
    problems = []
    for j, i in enumerate(wrong):
        first = np.flatnonzero(text[:, i])[0]
        problems.append(
            f"{path} {rows[first]}, column {header[i]!r}: {values[first, j]!r} is not a number "
            f"({such(int(counts[i]), 'value')} in a column of numbers); fill or drop them"
        )
    texts = dict(zip(textual, values[:, len(wrong) : len(wrong) + len(textual)].T, strict=True))
    refused = {
        i: [] if header[i] in free_text else _text_problems(path, header[i], column)
        for i, column in texts.items()
    }
    problems += [problem for found in refused.values() for problem in found]
    categorical = [i for i in textual if not refused[i]]
    numeric = [i for i in features if i not in textual and i not in wrong]
    labels = None if label is None else values[:, -1] if text_labels else numbers[:, label].copy()
    table = Table(
        path,
        numbers[:, numeric],
        [header[i] for i in numeric],
        np.column_stack([texts[i] for i in categorical]) if categorical else values[:, :0],
        [header[i] for i in categorical],
        labels,
        label_column,
        rows,
        dialect.delimiter,
    )
    return table, problems


@contextmanager
def csv_text(path: Path) -> Iterator[None]:
    """Refuse, in one line naming it, a file read within that is not CSV text (not UTF-8)."""
    try:
        yield
    except (UnicodeDecodeError, csv.Error) as error:
        raise DataError(f"{path} is not a CSV text file ({error})") from None


def _text_problems(path: Path, name: str, column: np.ndarray) -> list[str]:
    """Why a column of text is not a category, if it is not: dates or times, or an identifier or
    free text (a different value in most rows)."""
    present = column[~is_missing(column)]
    distinct = np.unique(present)
    dates = sum(bool(DATE.fullmatch(value)) for value in distinct)
    if len(distinct) and dates >= MOSTLY_DATES * len(distinct):
        shown = ", ".join(repr(value) for value in present[:2])  # as the file has them
        return [
            f"{path}, column {name!r}: dates or times ({shown}, ...) are neither numbers nor categories; "
            "leave the column out with data.init_args.drop_columns, or write the parts that matter "
            "(year, month, day of the week, hour) as columns of numbers"
        ]
    if len(distinct) > 20 and len(distinct) > MOST_DISTINCT * len(column):
        return [
            f"{path}, column {name!r}: {len(distinct)} different text values in {len(column)} rows; an "
            "identifier or free text is not a category: leave the column out with data.init_args.drop_columns"
        ]
    return []


def check_header_length(path: Path, file) -> None:
    """Refuse a header (the first line that is not blank) longer than ``HEADER_CHARACTERS``,
    reading at most that much of it."""
    # Two more characters than the limit hold a line of the limit's length and its line break.
    for line in iter(lambda: file.readline(HEADER_CHARACTERS + 2), ""):
        if len(line.rstrip("\r\n")) > HEADER_CHARACTERS:
            raise DataError(
                f"{path}: its header, the first line, is over {HEADER_CHARACTERS:,} characters; a CSV "
                "file names its columns on its first line, then has one line per sample"
            )
        if line.rstrip("\r\n"):
            return


def _dialect(sample: str) -> type[csv.Dialect]:
    """The dialect of a CSV file that begins with ``sample``: its delimiter is the one of
    ``DELIMITERS`` that splits the first lines alike, or a comma where none does (one column); its
    quotes are double quotes, as pandas and spreadsheets read them. The sniffer's guess of the quote
    is not taken: texts with apostrophes (``Nebraska 's``) made it guess ``'``, and a quoted
    comma then split a text in two."""
    lines = sample.splitlines()
    try:
        sniffed = csv.Sniffer().sniff("\n".join(lines[:-1] or lines), delimiters=DELIMITERS)  # whole lines
    except csv.Error:
        return csv.excel
    return type("Sniffed", (csv.excel,), {"delimiter": sniffed.delimiter})


def _read_numbers(path: Path, reader) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """A CSV file's header, its cells as numbers (NaN where missing or text), where they are text,
    and each row's number in the file (the header is row 1; blank lines are skipped). Read
    ``CHUNK_ROWS`` rows at a time, so that memory holds numbers, not the text of every cell."""
    header, chunks, row_numbers, lines = None, [], [], []
    for number, line in enumerate(reader, start=1):
        if not line:
            continue
        if header is None:
            header = [name.strip() for name in line]
            repeated = sorted(name for name, count in Counter(header).items() if count > 1)
            if repeated:
                more = len(repeated) - REPORTED_PROBLEMS
                shown = f"{repeated[:REPORTED_PROBLEMS]}" + (f" and {more} more" if more > 0 else "")
                raise DataError(f"{path}: the header names more than once the columns {shown}")
            continue
        if len(line) != len(header):
            raise DataError(
                f"{path} row {number} has {len(line)} values; the header names {len(header)} columns"
            )
        row_numbers.append(number)
        lines.append(line)
        if len(lines) == CHUNK_ROWS:
            chunks.append(_as_numbers(lines))
            lines = []
    if lines:
        chunks.append(_as_numbers(lines))
    if not chunks:
        raise DataError(f"{path} has no samples: it needs a header row, then one row per sample")
    numbers, text = (np.concatenate(parts) for parts in zip(*chunks, strict=True))
    return header, numbers, text, np.array(row_numbers)


def _as_numbers(lines: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """The rows' cells as numbers (NaN where missing or text), and where they are text."""
    numbers = np.empty((len(lines), len(lines[0])))
    text = np.zeros(numbers.shape, dtype=bool)
    for i, cells in enumerate(zip(*lines, strict=True)):
        try:
            numbers[:, i] = cells  # every cell a number, the common case: converted in C
        except ValueError:
            numbers[:, i] = [_number(cell) for cell in cells]
            text[:, i] = np.isnan(numbers[:, i]) & ~is_missing(np.array(cells, dtype=object))
    return numbers, text


def _read_text(reader, columns: list[int], count: int) -> np.ndarray:
    """The ``columns`` of a CSV file's ``count`` samples, as stripped text (Python strings, so that
    one long cell costs its own length, not every cell's)."""
    values = np.empty((count, len(columns)), dtype=object)
    if not columns:
        return values
    lines = (line for line in reader if line)
    next(lines)  # the header
    for row, line in enumerate(lines):
        values[row] = [line[i].strip() for i in columns]
    return values


def _number(text: str) -> float:
    """The number ``text`` writes, or NaN where it is missing or not a number."""
    try:
        return float(text)
    except ValueError:
        return np.nan


def is_missing(values: np.ndarray) -> np.ndarray:
    """Where ``values`` (text or numbers) are missing; see the module's docstring."""
    if values.dtype.kind in "USO":
        missing = (str(value).strip().lower() in MISSING for value in values.flat)
        return np.fromiter(missing, bool, values.size).reshape(values.shape)
    return np.isnan(values) if values.dtype.kind == "f" else np.zeros(values.shape, dtype=bool)


def such(count: int, noun: str) -> str:
    """``1 such value``, ``3 such values``: how many values a message's example stands for."""
    return f"{count} such {noun}{'' if count == 1 else 's'}"


def check_numeric(table: Table) -> None:
    """Refuse a numeric feature that is infinite or too large to train on in float32 (NaN is a
    missing value: see ``treat_missing``)."""
    refuse(table.source, numeric_problems(table))


def numeric_problems(table: Table) -> list[str]:
    """A message naming the first numeric feature that is infinite or too large to train on in
    float32: of each such column of a CSV file, or of the whole array of an array file."""
    flat = table.numeric.reshape(len(table), -1)
    bad = np.isinf(flat) | (np.abs(np.nan_to_num(flat)) > LARGEST_VALUE)
    groups = [[column] for column in np.flatnonzero(bad.any(axis=0))]
    if table.source.suffix != ".csv" and groups:
        groups = [[column for [column] in groups]]
    problems = []
    for columns in groups:
        row, column = np.argwhere(bad[:, columns])[0]
        value = flat[row, columns[column]]
        problem = "is not a finite number" if np.isinf(value) else f"is beyond ±{LARGEST_VALUE:.0e}"
        problems.append(
            f"{table.where(row, table.numeric_names[columns[column]])}: {value:g} {problem}; "
            f"{such(int(bad[:, columns].sum()), 'value')}, which cannot be trained on in float32 (a "
            "placeholder for a missing value?); fill or drop them"
        )
    return problems


def missing_problems(table: Table, advice: str) -> list[str]:
    """The table's first missing feature or label, counting the others, with ``advice``; none if
    nothing is missing."""
    label = np.zeros(len(table), dtype=bool) if table.labels is None else is_missing(table.labels)
    missing = np.column_stack([table.missing(), label])
    names = [*table.numeric_names, *table.categorical_names, table.label_name]
    rows = np.count_nonzero(missing.any(axis=1))
    return [
        f"{table.where(row, names[column])}: it is missing ({such(int(missing.sum()), 'value')} in "
        f"{rows} row{'s' if rows > 1 else ''}); {advice}"
        for row, column in np.argwhere(missing)[:1]
    ]


def class_labels(table: Table) -> np.ndarray:
    """The labels as class names (strings), refusing an infinite one or a fraction (a missing one
    has been refused or dropped by ``treat_missing``)."""
    labels = table.labels
    if labels.dtype.kind in "USO":
        return labels.astype(object)
    labels = labels.astype(np.float64)
    for bad, problem in (
        (~np.isfinite(labels), "is not finite"),
        (np.isfinite(labels) & (labels != np.round(labels)), "is not a class (a name or a whole number)"),
    ):
        if bad.any():
            first = np.flatnonzero(bad)[0]
            raise DataError(
                f"{table.where(first, table.label_name)}: the label {labels[first]:g} {problem}; "
                f"{such(int(bad.sum()), 'label')}"
                + ("; for numeric targets generate a regression project" if "class" in problem else "")
            )
    return np.array([str(int(label)) for label in labels])


def target_values(table: Table) -> np.ndarray:
    """The labels as regression targets (float64), refusing text and values float32 cannot train on
    (a missing one has been refused or dropped by ``treat_missing``)."""
    labels = table.labels
    if labels.dtype.kind in "USO":
        numbers = np.array([_number(str(label)) for label in labels])
        text = np.flatnonzero(np.isnan(numbers) & ~is_missing(labels))
        raise DataError(
            f"{table.where(text[0], table.label_name)}: the target {str(labels[text[0]])!r} is not a number; "
            f"{such(len(text), 'target')}; a regression target must be numeric"
        )
    labels = labels.astype(np.float64)
    bad = ~np.isfinite(labels) | (np.abs(np.nan_to_num(labels)) > LARGEST_VALUE)
    if bad.any():
        first = np.flatnonzero(bad)[0]
        raise DataError(
            f"{table.where(first, table.label_name)}: the target {labels[first]:g} is not finite or "
            f"beyond ±{LARGEST_VALUE:.0e}; {such(int(bad.sum()), 'target')}"
        )
    return labels


def treat_missing(table: Table, rule: str, advice: str) -> tuple[Table, np.ndarray, int]:
    """The table with its missing values treated by ``rule``, the rows to keep, and the number of
    values imputed.

    ``error`` refuses the first missing feature or label, with ``advice``; ``drop`` keeps the rows
    where nothing is missing; ``impute`` keeps the rows that have a label, and makes a missing text
    value the category ``MISSING_CATEGORY``. A missing number stays NaN: ``Preprocessing`` imputes
    it with the training split's median, inside the model, so that every split, ``predict`` and
    the exports impute alike.
    """
    if rule == "error":
        refuse(table.source, missing_problems(table, advice))
        return table, np.arange(len(table)), 0
    features = table.missing()
    label = np.zeros(len(table), dtype=bool) if table.labels is None else is_missing(table.labels)
    dropped = (label | features.any(axis=1)) if rule == "drop" else label
    kept = np.flatnonzero(~dropped)
    if len(table) and not len(kept):
        what = "value" if rule == "drop" else "label"
        raise DataError(
            f"{table.source}: all {len(table)} rows have a missing {what}, and data.init_args.missing={rule} "
            "drops them"
        )
    if rule == "drop":
        return table, kept, 0
    imputed = int(features[kept].sum())
    if table.categorical.size:
        text = np.where(is_missing(table.categorical), MISSING_CATEGORY, table.categorical)
        table = replace(table, categorical=text)
    return table, kept, imputed


def describe_missing(rule: str, rows: int, dropped: int, imputed: int) -> str | None:
    """What ``treat_missing`` did by ``rule`` to a table of ``rows`` rows, in words; None if nothing."""
    done = [f"{imputed:,} imputed"] if imputed else []
    if dropped:
        why = " (label missing)" if rule == "impute" else ""
        done.append(f"{dropped:,} of {rows:,} rows dropped{why}")
    return "; ".join(done) or None
