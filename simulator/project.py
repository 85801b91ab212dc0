"""Where the project's own folders are, for the commands that read them (report, validate, notebooks).

The scenarios are user-facing files at the top of a lastmile checkout, not package data: a command
takes the folder as an argument, else finds ``scenarios/`` in the working directory (or a parent),
else in the source tree this package was installed from (an editable install), else says so.
"""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError

MARKERS = ("llm", "dit", "validation")
"""Sub-folders that identify a lastmile ``scenarios/`` folder."""


def _is_scenarios(path: Path) -> bool:
    return path.is_dir() and all((path / m).is_dir() for m in MARKERS)


def scenarios_dir(explicit: str | Path | None = None) -> Path:
    """The ``scenarios/`` folder: ``explicit`` if given, else the nearest one up from the working
    directory, else the source tree's; a one-line error naming what was looked for if none."""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_dir():
            raise ConfigError("is not a folder", file=str(path))
        return path
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if _is_scenarios(folder / "scenarios"):
            return folder / "scenarios"
    source = Path(__file__).resolve().parents[1] / "scenarios"
    if _is_scenarios(source):
        return source
    raise ConfigError("no lastmile scenarios/ folder (with llm/, dit/ and validation/) in the working "
                      "directory, its parents or the source tree; run from a lastmile checkout or name the folder")
