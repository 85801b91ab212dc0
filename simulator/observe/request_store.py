"""Per-request results of a run, streamed to disk in request order as requests retire.

Once a request is done, what the run's outputs need of it (its timestamps, its latency breakdown,
its place in the trace's flows) is appended to one file per column in a temporary folder
(``tempfile``'s, so ``TMPDIR`` chooses where), and its in-memory state can go
(``observe.paged``). The metrics read the columns back one at a time at the end (a column of a
million requests is 8 MB), the per-request frames are built from them when first asked for, and the
run folder's CSVs are written from them chunk by chunk. The folder is removed when the store is
garbage-collected or the interpreter exits; its files are closed once the run has ended.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Iterator

import numpy as np


class RequestStore:
    """Append-only columns of ``dtypes``, one row per request, requests in id order."""

    def __init__(self, dtypes: dict[str, str]):
        self.dtypes = {k: np.dtype(v) for k, v in dtypes.items()}
        self.dir = Path(tempfile.mkdtemp(prefix="lastmile-requests-"))
        self._files = {k: open(self.dir / f"{k}.bin", "wb") for k in self.dtypes}
        self._finalizer = weakref.finalize(self, _remove, self.dir, dict(self._files))
        self.size = 0

    def append(self, n: int, **columns) -> None:
        """Append ``n`` rows; every column given (arrays of length n or scalars)."""
        if n <= 0:
            return
        for k, dtype in self.dtypes.items():
            v = np.asarray(columns[k], dtype=dtype)
            if v.ndim == 0:
                v = np.full(n, v, dtype=dtype)
            v.tofile(self._files[k])
        self.size += n

    def close(self) -> None:
        """No more rows: the files are closed (a run's Result may live long; its store holds no handle)."""
        for fh in self._files.values():
            fh.close()
        self._files = {}

    def column(self, name: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Rows ``lo..hi`` of one column, read back from disk."""
        hi = self.size if hi is None else min(hi, self.size)
        if name in self._files:
            self._files[name].flush()
        dtype = self.dtypes[name]
        if hi <= lo:
            return np.empty(0, dtype=dtype)
        return np.fromfile(self.dir / f"{name}.bin", dtype=dtype, count=hi - lo, offset=lo * dtype.itemsize)

    def chunks(self, size: int = 1 << 16) -> Iterator[tuple[int, int]]:
        """Row ranges ``(lo, hi)`` of about ``size`` rows, in order."""
        for lo in range(0, self.size, size):
            yield lo, min(lo + size, self.size)


def _remove(path: Path, files: dict) -> None:
    for fh in files.values():
        fh.close()
    shutil.rmtree(path, ignore_errors=True)
