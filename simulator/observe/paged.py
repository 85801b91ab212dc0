"""Per-request columns that hold only a window of requests in memory, with plain numpy indexing.

A long run has millions of requests but only a few hundred in flight at once. Each column is a
numpy array over every request id, backed by an anonymous memory map: pages the run never touches
cost nothing, and once every request of a span of ids has been retired (its results copied out,
``observe.request_store``), the pages under them are handed back to the operating system
(``madvise(MADV_DONTNEED)``), so the resident memory is the window, however long the run. The code
that reads and writes the columns indexes them as before (``t.computed[rid]``, ``t.blocks[ids] +=
need``): no wrapper stands between it and numpy.

Ids are prepared (set to each column's initial value) a chunk at a time, before their first use,
and released a chunk at a time, once retired; a retired id's values are never read again (they
read as zero where the pages were released).
"""

from __future__ import annotations

import mmap

import numpy as np

CHUNK = 4096
"""Ids prepared or released at a time: a whole number of 4 KiB pages for every dtype of 1 byte or more."""

_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_PRIVATE = getattr(mmap, "MAP_PRIVATE", None)
_ANONYMOUS = getattr(mmap, "MAP_ANONYMOUS", None)
# private anonymous pages: handed back by MADV_DONTNEED, and read as zero after (Python's
# default anonymous map is shared, whose pages that call does not free)
_MAPPABLE = None not in (_DONTNEED, _PRIVATE, _ANONYMOUS)


class Window:
    """Columns over ids ``0..n-1``, prepared up to ``prepared`` and released below ``released``."""

    def __init__(self, n: int):
        self.n = n
        self.prepared = 0
        self.released = 0
        self._columns: list[tuple[np.ndarray, mmap.mmap | None, object]] = []

    def column(self, dtype, fill=0) -> np.ndarray:
        """A new column of ``n`` values of ``dtype``, each ``fill`` once prepared."""
        dtype = np.dtype(dtype)
        nbytes = self.n * dtype.itemsize
        if _MAPPABLE and nbytes >= mmap.PAGESIZE:
            mm = mmap.mmap(-1, nbytes, flags=_PRIVATE | _ANONYMOUS)
            arr = np.frombuffer(mm, dtype=dtype, count=self.n)
        else:  # smaller than a page (or no way to hand pages back here): a plain array
            mm, arr = None, np.zeros(self.n, dtype=dtype)
        if fill != 0 and self.prepared:
            arr[: self.prepared] = fill
        self._columns.append((arr, mm, fill))
        return arr

    def prepare(self, upto: int) -> None:
        """Make ids below ``upto`` (rounded up to a chunk) ready: their initial values written."""
        if upto <= self.prepared:
            return
        hi = min(self.n, -(-upto // CHUNK) * CHUNK)
        for arr, _, fill in self._columns:
            if fill != 0:  # fresh pages read as zero already
                arr[self.prepared: hi] = fill
        self.prepared = hi

    def release(self, below: int) -> None:
        """Hand back the pages of every whole chunk of ids below ``below`` (all retired)."""
        hi = min(below, self.prepared) // CHUNK * CHUNK
        if hi <= self.released:
            return
        lo, self.released = self.released, hi
        page = mmap.PAGESIZE
        for arr, mm, _ in self._columns:
            if mm is None:
                continue
            size = arr.dtype.itemsize
            start = -(-lo * size // page) * page
            end = hi * size // page * page
            if end > start:
                mm.madvise(_DONTNEED, start, end - start)


class Arrivals:
    """Arrival times of every request, a plain array inside; reading or setting request ``rid``'s
    arrival prepares the window's ids up to a chunk past it. Every request's life starts there (the
    open loop reads its arrival time, the closed loop sets it), so no id is used unprepared."""

    __slots__ = ("values", "window")

    def __init__(self, values: np.ndarray, window: Window):
        self.values, self.window = values, window

    def reach(self, key) -> None:
        """Prepare the window's ids up to ``key`` (an id, or ids), as reading its arrival does."""
        if isinstance(key, (int, np.integer)):
            top = int(key) % max(self.window.n, 1)
        else:
            idx = np.arange(self.window.n)[key]
            if not idx.size:
                return
            top = int(idx.max())
        if top >= self.window.prepared:
            self.window.prepare(top + 1 + CHUNK)

    def __getitem__(self, key):
        self.reach(key)
        return self.values[key]

    def __setitem__(self, key, value) -> None:
        self.reach(key)
        self.values[key] = value

    def __len__(self) -> int:
        return len(self.values)

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype, copy=False)
