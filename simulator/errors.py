"""User-facing errors: one line naming the file, the key path and what is wrong."""

from __future__ import annotations


class LastmileError(Exception):
    """An error in the user's input; the CLI prints it on one line and exits 2."""

    def __init__(self, message: str, *, file: str | None = None, path: str | None = None, fix: str | None = None):
        self.file = file
        self.path = path
        self.problem = message  # what is wrong; ``fix``: what to do about it, where one thing fits every caller
        self.fix = fix
        self.message = f"{message}; {fix}" if fix else message
        super().__init__(self.__str__())

    def moved(self, *, file: str | None = None, path: str | None = None):
        """The same error (its problem and fix) at another file or key path: where a caller that read
        the input from elsewhere names it."""
        return type(self)(self.problem, file=file, path=path, fix=self.fix)

    def __str__(self) -> str:
        where = ": ".join(_clip(p, MAX_WHERE) for p in (self.file, self.path) if p)
        message = _clip(self.message, MAX_MESSAGE)
        return f"{where}: {message}" if where else message


MAX_MESSAGE = 300
"""Longest message text printed; an error that echoes a huge input is cut, never megabytes long."""

MAX_WHERE = 160
"""Longest file name or key path printed."""


def _clip(text: str, limit: int) -> str:
    """One line (newlines folded to spaces), at most ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class ConfigError(LastmileError):
    """A scenario value that cannot be used (unknown key, bad unit, impossible setup)."""


class UnitError(ValueError):
    """A quantity string whose unit or number cannot be parsed."""
