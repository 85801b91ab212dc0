"""Run folders: where ``lastmile run`` writes, and the rule that it never deletes what it did not write.

A run folder is written whole into a temporary sibling and moved into place, so it is never seen
half written. ``--out`` may name a new folder, an empty one, or a previous run folder (which is
replaced); any other non-empty folder, or a file, is refused before the simulation starts.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

from .errors import ConfigError

RUN_FILES = frozenset({"summary.json", "requests.csv", "breakdown.csv", "scenario.yaml", "trace.json"})
"""The files every run folder holds; figures (``*.png``) may sit beside them."""


def safe_name(name: str) -> str:
    """A scenario name as a folder name: letters, digits, ``.``, ``_`` and ``-`` only, never a path."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).strip(".-")
    return slug[:80] or "run"


def write_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` at ``path`` whole or not at all: into a temporary file beside it, renamed over it
    (removed again where the write fails)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_file_out(path: str | Path, flag: str) -> Path:
    """A file a command is to write (``flag`` names the option): refused before any work when it is a
    folder or its folder does not exist."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError("is a folder; name a file", file=f"{flag} {path}")
    if not p.parent.is_dir():
        raise ConfigError(f"its folder {str(p.parent)!r} does not exist", file=f"{flag} {path}")
    return p


def run_name(name: str, overrides: dict) -> str:
    """The name of a run of scenario ``name`` with ``--set`` ``overrides``: the scenario's, plus what
    was changed (``default-llama3-8b-h100-chat+model=llama-3-70b+parallel.tp=8``), so its folder
    and its summary say what ran; an override of ``name`` itself is taken as it is."""
    if not overrides or "name" in overrides:
        return name
    changes = "+".join(f"{key}={value}" if not isinstance(value, (dict, list)) else key
                       for key, value in overrides.items())
    return f"{name}+{changes}"[:160]


def _written_by_a_run(p: Path) -> bool:
    return p.is_file() and (p.name in RUN_FILES or p.suffix == ".png")


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` holds a previous run's files and nothing else."""
    if not (path / "summary.json").is_file() or not (path / "scenario.yaml").is_file():
        return False
    return all(_written_by_a_run(p) for p in path.iterdir())


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that would overwrite or hide files the run did not write."""
    if out.exists() and not out.is_dir():
        raise ConfigError("names a file, not a folder; choose a new folder", file=f"--out {out}")
    if out.is_dir() and any(out.iterdir()) and not is_run_folder(out):
        raise ConfigError("is a folder with other files in it, not a lastmile run folder; choose a new or "
                          "empty folder (nothing was written or deleted)", file=f"--out {out}")
    ancestor = out.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"cannot be created: {ancestor} is a file", file=f"--out {out}")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot be created: {ancestor} is not writable", file=f"--out {out}")


def default_out(name: str, root: Path = Path("runs")) -> Path:
    """``runs/<name>-<time>``, with a suffix if a run of the same name started in the same second."""
    stem = f"{safe_name(name)}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    out, n = root / stem, 2
    while out.exists():
        out, n = root / f"{stem}-{n}", n + 1
    return out


def _remove_run_folder(path: Path) -> None:
    """Delete a previous run folder's own files, then the folder; anything else stays."""
    for p in path.iterdir():
        if _written_by_a_run(p):
            p.unlink()
    path.rmdir()


OWNER = ".lastmile-pid"
"""The file naming the process that writes a temporary run folder, so a later run can tell a stale
one (its writer killed, even by SIGKILL) from one being written."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # someone else's process: not ours to judge
    return True


def clean_stale(out: Path) -> list[Path]:
    """Remove the temporary siblings of ``out`` that a killed run left: those holding an ``OWNER``
    file of a process no longer alive, and nothing but a run's own files; returns what went."""
    gone = []
    for d in out.parent.glob(f".{out.name}.*"):
        owner = d / OWNER
        try:
            if not (d.is_dir() and owner.is_file()) or _alive(int(owner.read_text().strip() or 0)):
                continue
            if any(not (_written_by_a_run(p) or p.name == OWNER) for p in d.iterdir()):
                continue
            for p in d.iterdir():
                p.unlink()
            d.rmdir()
            gone.append(d)
        except (OSError, ValueError):
            continue  # not readable as ours: left alone
    return gone


def write_run(result, out: Path, trace: bool = True, full_trace: bool = False) -> Path:
    """Write ``result`` to ``out`` atomically: into a temporary sibling first, then moved into place
    (without trace.json when ``trace`` is False). A SIGTERM while it writes removes the temporary
    folder as an error would; one a SIGKILL left is removed by the next run into the same place."""
    check_out(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        (tmp / OWNER).write_text(str(os.getpid()))
    except OSError as exc:
        raise ConfigError(f"cannot create the run folder ({exc.strerror or exc})", file=f"--out {out}") from None
    previous = _terminate_as_exit()
    try:
        result.write(tmp, parallel=True, trace=trace, full_trace=full_trace)
        (tmp / OWNER).unlink()
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            old.rmdir()
            out.rename(old)
            tmp.rename(out)
            _remove_run_folder(old)
        else:
            tmp.rename(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"cannot write the run folder ({exc.strerror or exc})", file=f"--out {out}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _restore(previous)
    return out


def _terminate_as_exit():
    """While a run folder is written, SIGTERM exits through Python (so the temporary folder is
    removed); returns the handler to restore (None off the main thread, where none is set)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def terminated(signum, frame):
        raise SystemExit(128 + signum)
    return signal.signal(signal.SIGTERM, terminated)


def _restore(previous) -> None:
    if previous is not None:
        import signal
        signal.signal(signal.SIGTERM, previous)
