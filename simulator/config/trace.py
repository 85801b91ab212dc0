"""Reading request traces and checking them against the scenario that replays them, at load time, so a
bad row is a one-line error before any run.

Three formats, chosen by the file's extension: CSV (``arrived_at`` in s, ``num_prefill_tokens``,
``num_decode_tokens``: the Splitwise/Vidur traces; or, by their headers, the Azure LLM inference
traces of 2023/2024 and BurstGPT: ``FORMATS``), JSON lines (``.jsonl``: the Mooncake traces,
one object per line with ``timestamp`` in ms, ``input_length``, ``output_length`` and ``hash_ids``,
the ids of the prompt's 512-token blocks, which the workload turns into
:class:`~simulator.workloads.prefix.PrefixIds`), and ShareGPT JSON (``.json``: conversations whose
lengths the model's tokenizer counts, ``config.sharegpt``; no times)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .models import MAX_CONTEXT
from .paths import shown as show_path

COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
FORMATS = {
    "vidur": COLUMNS,
    # AzurePublicDataset's LLM inference traces of 2023 (Splitwise) and 2024 (DynamoLLM): an absolute
    # wall-clock TIMESTAMP (``2023-11-16 18:15:46.6805900``), the prompt and the generated tokens
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    # BurstGPT (HPMLL/BurstGPT): Timestamp in seconds from the trace's start; failed requests have 0
    # response tokens and are dropped, as vLLM's BurstGPTDataset drops them
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}
"""The CSV request traces read, by their header: each format's arrival, prompt and output columns."""
JSONL_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
"""The keys of each line of a Mooncake trace (kvcache-ai/Mooncake FAST25-release/README.md)."""
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry of the Mooncake traces: "The block size is 512 tokens"
(kvcache-ai/Mooncake FAST25-release/README.md, commit 3b5a5941)."""
JSONL_TIME_UNIT = 1e-3
"""Seconds per ``timestamp`` unit of a JSON-lines trace: Mooncake's are milliseconds from the start
("the timing of request arrivals" of the FAST25 release; its one-hour conversation trace ends at
3,536,999)."""
KEY = "workload.trace"
MAX_TRACE_SECONDS = 1e8
"""Latest arrival a trace may hold, scaled: the simulated horizon's bound (``max_sim_time``)."""


def _fail(p: Path, row: int | None, what: str) -> ConfigError:
    if row is None:
        where = ""
    elif is_jsonl(p):
        where = f" line {row + 1}"  # one object per line, lines count from 1
    else:
        where = f" row {row + 2}"  # +2: the header line, and rows count from 1
    return ConfigError(f"trace {p.name}{where}: {what}", path=KEY)


def _first(mask: np.ndarray) -> int | None:
    bad = np.flatnonzero(mask)
    return int(bad[0]) if bad.size else None


@dataclass(frozen=True)
class TraceRows:
    """A checked trace as three columns (arrival in trace units, prompt and output tokens per row).

    Plain arrays rather than a DataFrame: a run reads a trace once, and pandas costs a large run
    0.3 s of import and 40 MB it has no other use for."""

    arrived_at: np.ndarray
    num_prefill_tokens: np.ndarray
    num_decode_tokens: np.ndarray
    hash_offsets: np.ndarray | None = None
    """JSON-lines traces: row i's prompt block ids are ``hash_ids[hash_offsets[i]:hash_offsets[i + 1]]``
    (blocks of :data:`MOONCAKE_BLOCK_TOKENS`); None for a CSV trace."""
    hash_ids: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrived_at)

    def __getitem__(self, column: str) -> np.ndarray:
        return getattr(self, column)

    def head(self, n: int | None) -> "TraceRows":
        """The first ``n`` rows (all for None), as copies."""
        columns = [self[c][:n].copy() for c in COLUMNS]
        if self.hash_offsets is None:
            return TraceRows(*columns)
        offsets = self.hash_offsets[:None if n is None else n + 1].copy()
        return TraceRows(*columns, offsets, self.hash_ids[:offsets[-1]].copy())


def _format(p: Path, names: list[str], formats: dict) -> tuple[str, tuple[str, ...]]:
    """The trace format a header names (the first of ``formats`` whose columns it has), or a one-line
    error naming what the first format lacks."""
    for fmt, cols in formats.items():
        if all(c in names for c in cols):
            return fmt, cols
    first, *rest = formats.values()
    missing = [c for c in first if c not in names]
    others = "; or ".join(", ".join(cols) for cols in rest)
    raise _fail(p, None, f"lacks column(s) {', '.join(missing)}; expected {', '.join(first)}"
                         + (f" (or {others})" if others else ""))


def _read_columns(p: Path, formats: dict = FORMATS) -> tuple[list[list[str]], int, str]:
    """The text of the columns of the trace's format (the first of ``formats`` its header has), row by
    row, the number of rows and that format."""
    try:
        with p.open(encoding="utf-8-sig", newline="") as f:  # a byte-order mark is not part of the header
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None or not any(h.strip() for h in header):
                raise _fail(p, None, "is not a readable CSV (no header line)")
            names = [h.strip() for h in header]
            fmt, columns = _format(p, names, formats)
            where = [names.index(c) for c in columns]
            width = len(names)
            rows = list(filter(None, reader))  # a blank line is skipped, as pandas skips it
            if max(map(len, rows), default=0) > width:  # read again for the line of the first such row
                f.seek(0)
                reader = csv.reader(f)
                next(reader)
                for row in reader:
                    if len(row) > width:
                        raise _fail(p, None, f"is not a readable CSV (line {reader.line_num} has {len(row)} "
                                             f"fields, the header {width})")
    except UnicodeDecodeError as exc:
        raise _fail(p, None, f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except (csv.Error, OSError) as exc:
        raise _fail(p, None, f"is not a readable CSV ({' '.join(str(exc).split())[:120]})") from None
    if min(map(len, rows), default=width) < width:  # a short row's missing cells are empty
        rows = [row + [""] * (width - len(row)) for row in rows]
    return [list(map(itemgetter(k), rows)) for k in where], len(rows), fmt


def _wall_clock(p: Path, cells: list[str]) -> np.ndarray:
    """An Azure trace's TIMESTAMP column as seconds from its first row (numpy's datetime64 at 100 ns,
    the traces' resolution); a cell that is no date and time is a one-line error naming its row."""
    try:
        stamps = np.array([c.strip().replace(" ", "T", 1) for c in cells], dtype="datetime64[ns]")
    except ValueError:
        for row, cell in enumerate(cells):
            try:
                np.datetime64(cell.strip().replace(" ", "T", 1), "ns")
            except ValueError:
                raise _fail(p, row, f"TIMESTAMP = {cell.strip()[:40]!r} is not a date and time") from None
        raise
    return (stamps - stamps[0]).astype(np.int64) / 1e9


def _number(text: str) -> float:
    """One cell as a float (NaN when it is not a number; underscores, which Python accepts, are not)."""
    try:
        return float(text) if "_" not in text else float("nan")
    except ValueError:
        return float("nan")


def _numbers(cells: list[str]) -> np.ndarray:
    """A column's cells as :func:`_number` reads each: all at once where every one is a number
    without underscores (every real trace), else cell by cell."""
    if "_" not in "".join(cells):
        try:
            return np.fromiter(map(float, cells), dtype=float, count=len(cells))
        except ValueError:
            pass
    return np.fromiter(map(_number, cells), dtype=float, count=len(cells))


def _is_count(x) -> bool:
    return type(x) is int  # not bool, not float: a token count or an id is a JSON integer


def _read_jsonl(p: Path) -> TraceRows:
    """A Mooncake trace, every line checked: one-line errors name the file's line."""
    def fail(line: int, what: str) -> ConfigError:
        return ConfigError(f"trace {p.name} line {line}: {what}", path=KEY)

    times: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    lines: list[int] = []
    hashes: list[list[int]] = []
    try:
        with p.open(encoding="utf-8-sig") as f:
            for line, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    row = json.loads(text)
                except ValueError as exc:
                    raise fail(line, f"is not JSON ({str(exc)[:80]})") from None
                except RecursionError:
                    raise fail(line, "is nested too deeply to be a trace row") from None
                if not isinstance(row, dict):
                    raise fail(line, f"is not a JSON object with keys {', '.join(JSONL_KEYS)}")
                missing = [k for k in JSONL_KEYS if k not in row]
                if missing:
                    raise fail(line, f"lacks key(s) {', '.join(missing)}; expected {', '.join(JSONL_KEYS)}")
                t, n_in, n_out, ids = (row[k] for k in JSONL_KEYS)
                if type(t) not in (int, float) or not math.isfinite(t) or t < 0:
                    raise fail(line, f"timestamp {str(t)[:40]!r} must be a non-negative number of ms")
                for key, v in (("input_length", n_in), ("output_length", n_out)):
                    if not _is_count(v) or not 1 <= v <= MAX_CONTEXT:
                        raise fail(line, f"{key} {str(v)[:40]!r} must be a whole number of tokens between 1 and "
                                         f"{MAX_CONTEXT:,}")
                if not isinstance(ids, list) or not all(_is_count(x) and x >= 0 for x in ids):
                    raise fail(line, "hash_ids must be a list of non-negative integers")
                need = -(-n_in // MOONCAKE_BLOCK_TOKENS)
                if len(ids) != need:
                    raise fail(line, f"{len(ids)} hash_ids do not cover input_length {n_in:,} ({need} blocks of "
                                     f"{MOONCAKE_BLOCK_TOKENS} tokens)")
                times.append(float(t))
                prompt.append(n_in)
                output.append(n_out)
                lines.append(line)
                hashes.append(ids)
    except UnicodeDecodeError as exc:
        raise _fail(p, None, f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    except OSError as exc:
        raise _fail(p, None, f"is not readable ({' '.join(str(exc).split())[:120]})") from None
    if not times:
        raise _fail(p, None, "has no rows")
    arrivals = np.asarray(times) * JSONL_TIME_UNIT
    row = _first(np.diff(arrivals) < 0)
    if row is not None:
        raise fail(lines[row + 1], "timestamp must not decrease from one line to the next")
    row = _first(arrivals > MAX_TRACE_SECONDS)
    if row is not None:
        raise fail(lines[row], f"timestamp must be at most {MAX_TRACE_SECONDS:g} s (about 3 years), "
                               f"got {arrivals[row]:g} s")
    offsets = np.zeros(len(hashes) + 1, dtype=np.int64)
    np.cumsum([len(h) for h in hashes], out=offsets[1:])
    ids = np.fromiter((x for h in hashes for x in h), dtype=np.int64, count=int(offsets[-1]))
    row = _first_misplaced_id(offsets, ids)
    if row is not None:
        raise fail(lines[row], "a hash_ids id must name one prefix: it recurs at another position or after "
                               "another id than where it first appeared")
    out = TraceRows(arrivals, np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64), offsets, ids)
    for array in (out.arrived_at, out.num_prefill_tokens, out.num_decode_tokens, offsets, ids):
        array.flags.writeable = False  # shared by the cache: callers get copies
    return out


def _first_misplaced_id(offsets: np.ndarray, ids: np.ndarray) -> int | None:
    """The first row whose ids break the rule that an id names a whole prefix: every occurrence of an
    id sits at the same position after the same id (Mooncake's remapped hashes keep it, as vLLM's
    chained block hashes do), so a prefix cache may key blocks by id alone."""
    if ids.size == 0:
        return None
    lengths = np.diff(offsets)
    start = np.repeat(offsets[:-1], lengths)
    pos = np.arange(ids.size, dtype=np.int64) - start
    pred = np.where(pos > 0, ids[np.maximum(np.arange(ids.size) - 1, 0)], -1)
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    bad = (pos != pos[first][inverse]) | (pred != pred[first][inverse])
    k = _first(bad)
    return None if k is None else int(np.searchsorted(offsets, k, side="right") - 1)


@lru_cache(maxsize=4)
def _read_checked(path: str, mtime_ns: int, size: int) -> TraceRows:
    """Every row of the file checked, so a corrupt trace is an error even in rows a short run leaves unread."""
    p = Path(path)
    if is_jsonl(p):
        return _read_jsonl(p)
    texts, rows, fmt = _read_columns(p)
    if rows == 0:
        raise _fail(p, None, "has no rows")
    out = {}
    shown = dict(zip(COLUMNS, FORMATS[fmt]))  # the file's own column names, for the messages
    for col, text in zip(COLUMNS, texts):
        values = _wall_clock(p, text) if fmt == "azure" and col == "arrived_at" else _numbers(text)
        row = _first(~np.isfinite(values))
        if row is not None:
            what = "is not a number" if np.isnan(values[row]) else "is not finite"
            raise _fail(p, row, f"{shown[col]} = {text[row].strip()[:40]!r} {what}")
        out[col] = values
    if fmt == "burstgpt":  # failed requests (no response) are not requests to replay
        served = out["num_decode_tokens"] > 0
        if not served.any():
            raise _fail(p, None, "has no request with response tokens (every row failed)")
        out = {col: values[served] for col, values in out.items()}
        out["arrived_at"] = out["arrived_at"] - out["arrived_at"][0]
        kept = np.flatnonzero(served)  # a row's number in the file, for the messages below
    else:
        kept = None

    def at(row: int) -> int:
        return row if kept is None else int(kept[row])

    for col in COLUMNS[1:]:
        values = out[col]
        row = _first(values != np.floor(values))
        if row is not None:
            raise _fail(p, at(row), f"{shown[col]} must be a whole number of tokens, got {values[row]:g}")
        row = _first((values < 1) | (values > MAX_CONTEXT))
        if row is not None:
            raise _fail(p, at(row), f"{shown[col]} must be between 1 and {MAX_CONTEXT:,} tokens, got {values[row]:g}")
    arrivals = out["arrived_at"]
    row = _first(np.r_[arrivals[:1] < 0, np.diff(arrivals) < 0])
    if row is not None:
        raise _fail(p, at(row), f"{shown['arrived_at']} must be non-negative and non-decreasing")
    row = _first(arrivals > MAX_TRACE_SECONDS)
    if row is not None:
        raise _fail(p, at(row), f"{shown['arrived_at']} must be at most {MAX_TRACE_SECONDS:g} s (about 3 years), "
                            f"got {arrivals[row]:g}")
    for array in out.values():
        array.flags.writeable = False  # shared by the cache: callers get copies
    return TraceRows(arrivals, out["num_prefill_tokens"].astype(np.int64), out["num_decode_tokens"].astype(np.int64))


def is_jsonl(path: str | Path) -> bool:
    """Whether a trace is read as JSON lines (a ``.jsonl`` file) rather than CSV."""
    return Path(path).suffix.lower() == ".jsonl"


def read_trace(path: str | Path, *, limit: int | None = None) -> TraceRows:
    """Load and check a trace (cached per file version); any problem is a ConfigError naming the file and row.

    ``limit``: only the first rows are returned (all rows are checked)."""
    p, st = trace_file(path)
    return _read_checked(str(p.resolve()), st.st_mtime_ns, st.st_size).head(limit)


def trace_file(path: str | Path):
    """The trace's path and its ``stat`` (its version, for the caches), or a one-line error where it is no
    readable regular file."""
    p = Path(path)
    shown = show_path(p)
    try:
        if not p.is_file():
            what = "is not a regular file (a folder, a device or a pipe)" if p.exists() else "does not exist"
            raise ConfigError(f"trace file {shown!r} {what}", path=KEY)
        return p, p.stat()
    except OSError as exc:  # a name too long for the file system, a folder without permission, ...
        raise ConfigError(f"trace file {shown!r} cannot be read ({exc.strerror or exc})", path=KEY) from None


def workload_rows(workload, limit: int | None = None) -> TraceRows:
    """The rows a workload's trace gives: a request trace's (CSV, JSON lines), or a ShareGPT dataset's
    lengths (``config.sharegpt``: no arrival times, all 0; the arrival process sets them)."""
    from .sharegpt import is_sharegpt, read_sharegpt

    if is_sharegpt(workload.trace):
        prompt, output = read_sharegpt(workload.trace, getattr(workload, "tokenizer", None),
                                       workload.requests if limit is None else limit)
        return TraceRows(np.zeros(len(prompt)), prompt, output)
    return read_trace(workload.trace, limit=limit)


def repeat_period(arrived_at: np.ndarray) -> float:
    """Time (trace units) between a repetition's first arrival and the next repetition's: the trace's span
    plus its mean inter-arrival gap (``span x rows / (rows - 1)``; 0 for a one-row trace)."""
    rows = len(arrived_at)
    if rows < 2:
        return 0.0
    span = float(arrived_at[-1] - arrived_at[0])
    return span + span / (rows - 1)


def repeated_rows(rows: int, n: int) -> np.ndarray:
    """Row of each of n requests replayed from a ``rows``-row trace: request i is row i mod rows."""
    return np.arange(n, dtype=np.int64) % rows


def repeated_arrivals(arrived_at: np.ndarray, n: int) -> np.ndarray:
    """Arrival times (trace units, the first at 0) of n requests replayed from a trace: request i is row
    i mod rows of repetition k = i // rows, at ``arrived_at[i mod rows] - arrived_at[0] + k x period``
    (:func:`repeat_period`), so times keep increasing from one repetition to the next."""
    rows = len(arrived_at)
    i = np.arange(n, dtype=np.int64)
    base = np.asarray(arrived_at, dtype=float) - float(arrived_at[0])
    return base[i % rows] + (i // rows) * repeat_period(arrived_at)


def check_trace(scenario) -> None:
    """Reject a trace that cannot serve the scenario: too few rows, or requests beyond the model's context."""
    w = scenario.workload
    if not w.trace:
        return
    df = workload_rows(w)
    name = Path(w.trace).name
    repeat = getattr(w, "trace_repeat", False)
    if len(df) < w.requests and not repeat:
        raise ConfigError(f"{w.requests:,} requests asked of trace {name}, which has {len(df):,} rows; "
                          f"set workload.requests to at most {len(df):,}, or workload.trace_repeat: true to "
                          "replay the trace again and again", path="workload.requests")
    df = df.head(w.requests)  # with trace_repeat, the rows the repetitions cycle through
    span = float(repeated_arrivals(df.arrived_at, w.requests)[-1]) * w.trace_time_scale
    if w.arrival == "trace" and span > MAX_TRACE_SECONDS:
        raise ConfigError(f"trace {name} spans {span:g} s once scaled, beyond {MAX_TRACE_SECONDS:g} s (about 3 "
                          "years); lower workload.trace_time_scale", path="workload.trace_time_scale")
    context = getattr(scenario.model, "context_length", None)
    if context is None:
        return
    output = df.num_decode_tokens
    window = f"{scenario.model.name}'s {context:,}-token context"
    if w.over_context == "truncate_prompt":  # prompts are cut to fit; an output alone must leave room
        row = _first(output >= context)
        if row is not None:
            raise _fail(Path(w.trace), row, f"num_decode_tokens {output[row]:,} leave no room for a prompt in "
                                            f"{window}")
        return
    total = df.num_prefill_tokens + output
    row = _first(total > context)
    if row is not None:
        raise _fail(Path(w.trace), row, f"prompt + output = {total[row]:,} tokens exceed {window}; set "
                                        "workload.over_context: truncate_prompt to cut prompts to fit (as Vidur does)")


def fit_to_context(prompt: np.ndarray, output: np.ndarray, context: int | None, over_context: str) -> np.ndarray:
    """Prompts cut so prompt + output fits the context (``truncate_prompt``, Vidur's trace rule), else as given."""
    if context is None or over_context != "truncate_prompt":
        return prompt
    return np.minimum(prompt, context - output).astype(np.int64)
