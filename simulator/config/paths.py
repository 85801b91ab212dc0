"""File-system questions a scenario's paths raise, answered without raising: a name the system cannot
hold (longer than its limit, say) is simply a file that is not there, for the reader to report."""

from __future__ import annotations

from pathlib import Path


def exists(path: Path) -> bool:
    """Whether ``path`` exists (False where the system cannot even look it up)."""
    try:
        return path.exists()
    except OSError:
        return False


def is_file(path: Path) -> bool:
    """Whether ``path`` is a file (False where the system cannot even look it up)."""
    try:
        return path.is_file()
    except OSError:
        return False


def is_dir(path: Path) -> bool:
    """Whether ``path`` is a folder (False where the system cannot even look it up)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def shown(path) -> str:
    """``path`` as an error message shows it: whole up to 120 characters, else its start and its end."""
    text = str(path)
    return text if len(text) <= 120 else f"{text[:60]}...{text[-40:]}"
