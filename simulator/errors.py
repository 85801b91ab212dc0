"""User-facing errors: one line naming the file, the key path and what is wrong."""

from __future__ import annotations


class LastmileError(Exception):
    """An error in the user's input; the CLI prints it on one line and exits 2."""

    def __init__(self, message: str, *, file: str | None = None, path: str | None = None):
        self.file = file
        self.path = path
        self.message = message
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = ": ".join(p for p in (self.file, self.path) if p)
        return f"{where}: {self.message}" if where else self.message


class ConfigError(LastmileError):
    """A scenario value that cannot be used (unknown key, bad unit, impossible setup)."""


class UnitError(ValueError):
    """A quantity string whose unit or number cannot be parsed."""
