"""Per-request results of a run, streamed to disk in request order as requests retire.

Once a request is done, what the run's outputs need of it (its timestamps, its latency breakdown,
its place in the trace's flows) is appended to an anonymous temporary file (``tempfile``'s, so
``TMPDIR`` chooses where; it has no name, so nothing is left behind however the process ends), and
its in-memory state can go (``observe.paged``). The metrics read the columns back one at a time at
the end (a column of a million requests is 8 MB), the per-request frames are built from them when
first asked for, and the run folder's CSVs are written from them chunk by chunk.
"""

from __future__ import annotations

import tempfile
from typing import Iterator

import numpy as np

BLOCK_ROWS = 1 << 12
"""Rows gathered in memory before they are written, as one block of every column."""


class RequestStore:
    """Append-only columns of ``dtypes``, one row per request, requests in id order."""

    def __init__(self, dtypes: dict[str, str]):
        self.dtypes = {k: np.dtype(v) for k, v in dtypes.items()}
        self._file = tempfile.TemporaryFile(prefix="lastmile-requests-")
        self._blocks: list[tuple[int, int, dict[str, int]]] = []  # rows lo..hi, each column's offset
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0
        self.size = 0

    def append(self, n: int, **columns) -> None:
        """Append ``n`` rows; every column given (arrays of length n or scalars)."""
        if n <= 0:
            return
        part = {}
        for k, dtype in self.dtypes.items():
            v = np.asarray(columns[k], dtype=dtype)
            part[k] = np.full(n, v, dtype=dtype) if v.ndim == 0 else v.copy()
        self._pending.append(part)
        self._pending_rows += n
        self.size += n
        if self._pending_rows >= BLOCK_ROWS:
            self.close()

    def close(self) -> None:
        """Write the rows gathered so far as one block (the end of a run calls it; appending may go on)."""
        if not self._pending:
            return
        fh = self._file
        fh.seek(0, 2)
        lo = self.size - self._pending_rows
        offsets = {}
        for k in self.dtypes:
            offsets[k] = fh.tell()
            fh.write(np.concatenate([p[k] for p in self._pending]).tobytes())
        self._blocks.append((lo, self.size, offsets))
        self._pending, self._pending_rows = [], 0

    def column(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows ``lo..hi`` of one column, read back from disk."""
        self.close()
        hi = self.size if hi is None else min(hi, self.size)
        dtype = self.dtypes[name]
        out = np.empty(max(hi - lo, 0), dtype=dtype)
        fh = self._file
        fh.flush()
        for blo, bhi, offsets in self._blocks:
            a, b = max(lo, blo), min(hi, bhi)
            if a >= b:
                continue
            fh.seek(offsets[name] + (a - blo) * dtype.itemsize)
            out[a - lo: b - lo] = np.frombuffer(fh.read((b - a) * dtype.itemsize), dtype=dtype)
        return out

    def chunks(self, size: int = 1 << 16) -> Iterator[tuple[int, int]]:
        """Row ranges ``(lo, hi)`` of about ``size`` rows, in order."""
        for lo in range(0, self.size, size):
            yield lo, min(lo + size, self.size)
