"""Progress and chatter on stderr for long commands: a tqdm bar on a terminal, plain lines in logs.

Only what is printed depends on this module, never a result. The command line sets the
verbosity once (``-q`` 0, default 1, ``-v`` 2); the Python API leaves it unset, and then only an
interactive session (a terminal or Jupyter) sees a bar and nothing else is printed. Everything
goes to stderr so that ``--json`` stdout stays clean.
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import contextmanager

QUIET, NORMAL, VERBOSE = 0, 1, 2

#: Plain (non-terminal) progress prints a line each time this fraction of the work is done.
LINE_STEP = 0.1

_level: int | None = None  # None: library use (no CLI); bars only when interactive, no lines


def configure(level: int | None) -> None:
    """Set the verbosity for this process (the CLI calls it; None restores library behaviour)."""
    global _level
    _level = level


def level() -> int | None:
    """The configured verbosity, or None when not run from the command line."""
    return _level


def verbose() -> bool:
    """Whether ``-v`` asked for extra detail (timings)."""
    return _level is not None and _level >= VERBOSE


def _interactive() -> bool:
    return sys.stderr.isatty() or "ipykernel" in sys.modules


def info(text: str) -> None:
    """An informational line on stderr (``wrote ...``); silent under ``-q`` and in library use."""
    if _level is not None and _level >= NORMAL:
        print(text, file=sys.stderr)


@contextmanager
def no_details():
    """Within the block, ``-v``'s lines are not printed: work that repeats what they said (a second
    simulation of the same deployment, as the last-mile counterfactual runs)."""
    global _level
    before = _level
    if _level is not None and _level > NORMAL:
        _level = NORMAL
    try:
        yield
    finally:
        _level = before


def detail(text: str) -> None:
    """A ``-v`` only line on stderr (timings, sizes)."""
    if verbose():
        print(f"lastmile: {text}", file=sys.stderr)


class Progress:
    """Counts ``total`` items of work: a tqdm bar on a TTY, ``desc: i/total unit`` lines otherwise.

    ``enabled`` None decides by verbosity: from the command line always (unless ``-q``); from
    the API only in an interactive session and when ``total >= min_total``.
    """

    def __init__(self, total: int, desc: str, unit: str, enabled: bool | None = None, min_total: int = 1):
        self.total, self.desc, self.unit = int(total), desc, unit
        self.done = 0
        self._bar = None
        self._lines = False
        self._next_line = 0
        self._t0 = time.perf_counter()
        if enabled is None:
            enabled = (_level >= NORMAL) if _level is not None else (_interactive() and self.total >= min_total)
        if not enabled or self.total <= 0:
            return
        if _interactive():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, desc=desc, unit=unit, file=sys.stderr, leave=False)
        else:
            self._lines = True
            self._next_line = 1

    def update(self, n: int = 1, note: str = "") -> None:
        """Mark ``n`` more items done; ``note`` (e.g. the family name) joins the plain line."""
        self.done += n
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(n)
        elif self._lines and (self.done >= self._next_line or self.done >= self.total):
            self._line(note)
            step = max(1, math.ceil(self.total * LINE_STEP))
            self._next_line = (self.done // step + 1) * step

    def _line(self, note: str) -> None:
        extra = f" ({note})" if note else ""
        if verbose():
            extra += f" {time.perf_counter() - self._t0:.1f} s"
        print(f"{self.desc}: {self.done}/{self.total} {self.unit}{extra}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Remove the bar; the last plain line has already been printed by ``update``."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._lines = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
