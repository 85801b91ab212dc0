"""``lastmile report``: regenerate the report in results/ (summary CSV, figures, README), or check it."""

from __future__ import annotations

HELP = "run the report suite and write results/ (summary.csv, figures, README.md); --check compares"


def add_arguments(p) -> None:
    p.add_argument("--out", default="results", help="report folder (default: results/)")
    p.add_argument("--check", action="store_true",
                   help="regenerate into a temp folder and fail if a committed CSV differs")


def main(args) -> int:
    from ..report.suite import check, generate

    if args.check:
        return check(args.out)
    out = generate(args.out)
    files = sorted(p.name for p in out.iterdir() if p.suffix in (".csv", ".png", ".md"))
    print(f"wrote {out}/: {', '.join(files)}")
    return 0
