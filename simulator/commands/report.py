"""``lastmile report``: regenerate the report in results/ (summary CSV, figures, README), or check it."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError

HELP = "run the report suite and write results/ (summary.csv, figures, README.md); --check compares"


def add_arguments(p) -> None:
    p.add_argument("--out", default="results", help="report folder (default: results/)")
    p.add_argument("--check", action="store_true",
                   help="regenerate into a temp folder and fail if a committed CSV differs")


def main(args) -> int:
    from ..report.suite import check, generate

    if args.check:
        return check(args.out)
    _check_out(Path(args.out))  # before the suite runs
    out = generate(args.out)
    files = sorted(p.name for p in out.iterdir() if p.suffix in (".csv", ".png", ".md"))
    print(f"wrote {out}/: {', '.join(files)}")
    return 0


def _check_out(out: Path) -> None:
    """The report folder is new, or holds only what a report writes (README.md, summary.csv, figures):
    a folder of other files is refused before any experiment runs, and nothing of them is touched."""
    if out.exists() and not out.is_dir():
        raise ConfigError("is a file; name a folder for the report", file=f"--out {out}")
    if out.is_dir():
        other = sorted(p.name for p in out.iterdir() if not (p.name in ("README.md", "summary.csv") or p.suffix == ".png"))
        if other:
            raise ConfigError(f"holds files a report does not write ({', '.join(other[:3])}"
                              f"{', ...' if len(other) > 3 else ''}); name a new folder or a previous report's",
                              file=f"--out {out}")
