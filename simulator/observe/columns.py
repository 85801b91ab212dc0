"""Growable column store: per-step and per-token records kept as numpy arrays, not Python objects."""

from __future__ import annotations

import numpy as np


class Columns:
    """Named numpy columns that grow by doubling; appending many values is one slice assignment."""

    def __init__(self, dtypes: dict[str, str], capacity: int = 1024):
        self._data = {k: np.empty(capacity, dtype=d) for k, d in dtypes.items()}
        self.size = 0

    def _grow(self, need: int) -> None:
        cap = len(next(iter(self._data.values())))
        if need <= cap:
            return
        new_cap = max(need, 2 * cap)
        for k, arr in self._data.items():
            grown = np.empty(new_cap, dtype=arr.dtype)
            grown[: self.size] = arr[: self.size]
            self._data[k] = grown

    def extend(self, n: int, **values) -> None:
        """Append ``n`` rows; each value is a scalar (broadcast) or an array of length n."""
        if n <= 0:
            return
        self._grow(self.size + n)
        for k, arr in self._data.items():
            arr[self.size: self.size + n] = values[k]
        self.size += n

    def append(self, **values) -> int:
        """Append one row of scalars; returns its index."""
        self._grow(self.size + 1)
        i = self.size
        for k, arr in self._data.items():
            arr[i] = values[k]
        self.size = i + 1
        return i

    def keep(self, mask: np.ndarray) -> None:
        """Drop the rows where ``mask`` (one bool per row) is False; the rest keep their order."""
        n = int(np.count_nonzero(mask))
        for arr in self._data.values():
            arr[:n] = arr[: self.size][mask]
        self.size = n

    def __getitem__(self, key: str) -> np.ndarray:
        return self._data[key][: self.size]

    def gather(self, index, keys) -> list:
        """The rows ``index`` (an array of row numbers) of each of ``keys``."""
        return [self._data[k][index] for k in keys]

    def drop(self, key: str) -> None:
        """Free a column that is no longer read."""
        del self._data[key]

    def set(self, key: str, index: int, value) -> None:
        """Overwrite one earlier row's value."""
        self._data[key][index] = value


class RingColumns(Columns):
    """The last ``capacity`` rows of named columns, addressed by their absolute row numbers: for
    records read only shortly after they are written (an engine's steps, while the token ledger
    folds the rows that refer to them), so memory stays flat however long the run. ``size``
    counts every row ever appended."""

    def __init__(self, dtypes: dict[str, str], capacity: int = 1 << 16):
        super().__init__(dtypes, capacity)
        self.capacity = capacity

    def _grow(self, need: int) -> None:  # never grows: old rows are overwritten
        return

    def extend(self, n: int, **values) -> None:
        if n <= 0:
            return
        if n > self.capacity:
            raise ValueError(f"{n} rows do not fit a ring of {self.capacity}")
        at = self.size % self.capacity
        first = min(n, self.capacity - at)
        for k, arr in self._data.items():
            v = values[k]
            if first == n:  # no wrap: one slice (a scalar broadcasts)
                arr[at: at + n] = v
                continue
            v = np.broadcast_to(np.asarray(v), (n,))
            arr[at: at + first] = v[:first]
            arr[: n - first] = v[first:]
        self.size += n

    def append(self, **values) -> int:
        i, at = self.size, self.size % self.capacity
        for k, arr in self._data.items():
            arr[at] = values[k]
        self.size = i + 1
        return i

    def oldest(self) -> int:
        """The first row number still held."""
        return max(0, self.size - self.capacity)

    def __getitem__(self, key: str) -> "_RingView":
        return _RingView(self._data[key], self.capacity)

    def gather(self, index, keys) -> list:
        at = np.asarray(index) % self.capacity  # once for every column
        return [self._data[k][at] for k in keys]

    def set(self, key: str, index: int, value) -> None:
        self._data[key][index % self.capacity] = value


class _RingView:
    """A ring column indexed by absolute row numbers (those still held)."""

    def __init__(self, data: np.ndarray, capacity: int):
        self.data, self.capacity = data, capacity

    def __getitem__(self, index):
        return self.data[np.asarray(index) % self.capacity]
