"""``lastmile validate``: predicted vs published measurements, per row and per family."""

from __future__ import annotations

import json
import math
import sys
import time

from ..errors import ConfigError

HELP = ("run the validation suite (scenarios/validation/): predicted vs published measurements with the signed "
        "% error, and each family's median and max |error|")


def add_arguments(p) -> None:
    p.add_argument("--family", action="append", default=[], metavar="NAME",
                   help="run only this family (repeatable); default: all")
    p.add_argument("--dir", help="directory of family YAML files (default: scenarios/validation)")
    p.add_argument("--json", action="store_true", help="print the table (rows and per-family summary) as JSON")
    p.add_argument("--write-readme", metavar="PATH",
                   help="rewrite the block between <!-- fidelity:start --> and <!-- fidelity:end --> in PATH "
                        "with the generated fidelity table")
    p.add_argument("--write-fidelity", metavar="PATH",
                   help="write the families' misses and the set-ups each covers as JSON (the status `lastmile run` "
                        "reads for its caveat: simulator/data/fidelity.json; needs the whole suite)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a family misses its target (median and max |error|), naming each that does")


def _clean(records: list[dict]) -> list[dict]:
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in records]


def main(args) -> int:
    from ..validate import fidelity_markdown, format_table, rewrite_readme, run_validation, summarize

    from ..runfolder import check_file_out

    if args.write_readme:
        check_file_out(args.write_readme, "--write-readme")
    if args.write_fidelity:
        check_file_out(args.write_fidelity, "--write-fidelity")
        if args.family:
            raise ConfigError("needs the whole suite (the status of every family): drop --family",
                              file="--write-fidelity")
    t0 = time.perf_counter()
    table = run_validation(args.family or None, args.dir)
    elapsed = time.perf_counter() - t0
    if args.json:
        json.dump({"rows": _clean(table.to_dict("records")), "families": _clean(summarize(table).to_dict("records")),
                   "runtime_s": elapsed}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(table))
        print(f"\n{len(table)} rows in {elapsed:.1f} s")
    if args.write_readme:
        rewrite_readme(args.write_readme, fidelity_markdown(table, args.dir))
        print(f"wrote the fidelity table into {args.write_readme}", file=sys.stderr)
    if args.write_fidelity:
        from ..coverage import status_document
        from ..runfolder import write_atomically

        doc = status_document(summarize(table).to_dict("records"), table.to_dict("records"), table.attrs["covers"])
        write_atomically(args.write_fidelity, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote the families' status into {args.write_fidelity}", file=sys.stderr)
    missed = summarize(table)
    missed = missed[~missed.meets_target]
    if len(missed):
        where = ", ".join(f"{r.family} {r.metric} ({r.median_abs_pct:.1f}% median)" for r in missed.itertuples())
        print(f"lastmile: {'error' if args.strict else 'note'}: {len(missed)} of {len(summarize(table))} family "
              f"metrics miss their target: {where}", file=sys.stderr)
        if args.strict:
            return 1
    return 0
