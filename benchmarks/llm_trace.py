"""Benchmark: the 10,000-request splitwise_conv.csv scenario, whole process, spans off and on.

Kept for its old name: a thin wrapper around ``benchmarks/run.py`` (``make bench``), which times
``lastmile run`` as a child process, reports wall time, peak RSS and wall time in reference units,
and writes its records to ``runs/bench/results.jsonl`` (ignored by git), not to a tracked file.
Arguments are passed through (``--repeats N``, ``--record``, ``--series``...).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
