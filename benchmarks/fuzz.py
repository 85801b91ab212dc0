"""Issue 9's acceptance run: >= 1,000 generated bad inputs through the CLI and the Python API.

    python benchmarks/fuzz.py --n 1000 [--jobs 2] [--seed 0] [--report /tmp/fuzz_failures.md]

Every input (tests/fuzz_inputs.py) goes through ``lastmile run`` in a subprocess and, where it
has an API form, through ``simulator.run`` in a long-lived worker process. Prints a table per
attack class and the first failing examples with their output; exits 1 if any check fails.
Writes nothing into the tree: the inputs live in a temp folder that is removed at the end
(``--keep-failing DIR`` writes the failing inputs' folders to DIR for a closer look).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.dont_write_bytecode = True  # no __pycache__ in tests/ from this run

import fuzz_inputs as fz  # noqa: E402


def cause_key(o: fz.Outcome, cause: str) -> str:
    """A cause with its particulars (numbers, paths) taken out, to group failures."""
    c = re.sub(r"\d+", "N", cause)
    c = re.sub(r": (created|deleted|changed) .*", r": \1 ...", c)
    if c.startswith("wrote outside runs/"):
        c = "wrote outside runs/"
    return f"{o.via.upper()}: {c}"


def run_all(cases, jobs: int, tmp: Path, progress: bool):
    local = threading.local()
    workers = []
    lock = threading.Lock()

    def worker() -> fz.ApiWorker:
        w = getattr(local, "w", None)
        if w is None:
            w = local.w = fz.ApiWorker()
            with lock:
                workers.append(w)
        return w

    def one(i, case):
        out = []
        if case.cli:
            out.append(fz.check_cli(case, tmp))
        if case.api:
            out.append(worker().check(case, tmp))
        return i, out

    results = [None] * len(cases)
    done = 0
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(one, i, c) for i, c in enumerate(cases)]
            for fut in as_completed(futures):
                i, out = fut.result()
                results[i] = out
                done += 1
                if progress and (done % 50 == 0 or done == len(cases)):
                    bad = sum(1 for r in results if r and any(not o.ok for o in r))
                    print(f"  {done}/{len(cases)} inputs, {bad} failing, {time.monotonic() - t0:.0f} s",
                          file=sys.stderr, flush=True)
    finally:
        for w in workers:
            w.close()
    return results


def table(cases, results) -> str:
    rows = []
    per = defaultdict(lambda: Counter())
    for case, outs in zip(cases, results):
        c = per[case.cls]
        c["inputs"] += 1
        c["pass"] += all(o.ok for o in outs)
        c["fail"] += not all(o.ok for o in outs)
        for o in outs:
            c[f"{o.via}_checks"] += 1
            c[f"{o.via}_fail"] += not o.ok
    head = f"{'class':<13} {'inputs':>6} {'pass':>6} {'fail':>6}   {'CLI fail':>12} {'API fail':>12}"
    rows.append(head)
    rows.append("-" * len(head))
    total = Counter()
    for cls in fz.CLASSES:
        if cls not in per:
            continue
        c = per[cls]
        total.update(c)
        rows.append(f"{cls:<13} {c['inputs']:>6} {c['pass']:>6} {c['fail']:>6}   "
                    f"{c['cli_fail']:>5}/{c['cli_checks']:<6} {c['api_fail']:>5}/{c['api_checks']:<6}")
    rows.append("-" * len(head))
    rows.append(f"{'total':<13} {total['inputs']:>6} {total['pass']:>6} {total['fail']:>6}   "
                f"{total['cli_fail']:>5}/{total['cli_checks']:<6} {total['api_fail']:>5}/{total['api_checks']:<6}")
    return "\n".join(rows)


# the cause a failing check is filed under: the first of these its causes match (the others follow from it)
PRIMARY = ("hang", "process", "killed", "traceback", "raised", "accepted", "exit", "wrote outside",
           "pre-existing", "folder or file left", "files changed", "N run folders", "N lines",
           "line does not start", "message of", "line of", "key not named")


def primary_cause(o: fz.Outcome) -> str:
    keys = [cause_key(o, c) for c in o.causes]
    for p in PRIMARY:
        for k in keys:
            if k.split(": ", 1)[1].startswith(p):
                return k
    return keys[0]


def group_failures(cases, results):
    """Failing checks grouped by their primary cause, largest group first."""
    groups = defaultdict(list)
    for case, outs in zip(cases, results):
        for o in outs:
            if not o.ok:
                groups[primary_cause(o)].append(o)
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


def failures_markdown(groups, table_text: str, args, seconds: float) -> str:
    lines = [f"# lastmile fuzz failures (benchmarks/fuzz.py --n {args.n} --seed {args.seed})", "",
             f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')}, {seconds:.0f} s. Reproduce one: "
             "`python benchmarks/fuzz.py --n N --seed S --keep-failing DIR` writes each failing input's "
             "folder (scenario.yaml, trace.csv, prof.yaml; run the command from its w1/w2/w3).", "",
             "```", table_text, "```", ""]
    if not groups:
        lines.append("No failures.")
    for cause, outs in groups:
        classes = Counter(o.case.cls for o in outs)
        lines.append(f"## {cause} — {len(outs)} checks ({', '.join(f'{k} {v}' for k, v in classes.most_common())})")
        lines.append("")
        seen = set()
        shown = 0
        for o in outs:
            sig = (o.case.cls, o.case.key, o.case.desc.split(" [")[0])
            if sig in seen:
                continue
            seen.add(sig)
            shown += 1
            if shown > 8:
                break
            lines.append(f"- **{o.case.cls}** `{o.case.key}`: {o.case.desc} (base {o.case.base}; {o.seconds:.1f} s)")
            lines.append(f"  - all causes: {'; '.join(o.causes)}")
            lines.append(f"  - command: `{o.command}`")
            out = o.output.replace("```", "'''")
            lines.append("  - output:")
            lines.append("")
            lines.append("    ```")
            lines += [f"    {ln}" for ln in out.splitlines()[:25]]
            lines.append("    ```")
        more = len({(o.case.cls, o.case.key, o.case.desc.split(' [')[0]) for o in outs}) - min(shown, 8)
        if more > 0:
            lines.append(f"- ... and {more} more distinct inputs")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1000, help="number of generated inputs (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="inputs checked at once (default 2)")
    p.add_argument("--classes", help="comma-separated attack classes (default: all)")
    p.add_argument("--report", help="write the failures grouped by cause to this Markdown file")
    p.add_argument("--keep-failing", metavar="DIR", help="materialize each failing input under DIR")
    p.add_argument("--examples", type=int, default=3, help="failing examples printed per cause (default 3)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    classes = tuple(args.classes.split(",")) if args.classes else fz.CLASSES
    unknown = [c for c in classes if c not in fz.CLASSES]
    if unknown:
        p.error(f"unknown class(es) {', '.join(unknown)}; known: {', '.join(fz.CLASSES)}")
    cases = fz.generate(args.n, args.seed, classes)
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="lastmile-fuzz-"))
    try:
        results = run_all(cases, args.jobs, tmp, not args.quiet)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.monotonic() - t0
    text = table(cases, results)
    groups = group_failures(cases, results)
    print(f"lastmile fuzz: {len(cases)} inputs (seed {args.seed}), {seconds:.0f} s\n")
    print(text)
    if groups:
        print("\nfailures by cause (checks):")
        for cause, outs in groups:
            print(f"  {len(outs):>5}  {cause}")
        print("\nfirst failing examples:")
        for cause, outs in groups:
            print(f"\n== {cause}")
            for o in outs[: args.examples]:
                print(f"  [{o.case.cls}] {o.case.desc}  (base {o.case.base}): {'; '.join(o.causes)}")
                print(f"    $ {o.command}")
                for ln in o.output.splitlines()[:6]:
                    print(f"    | {ln[:220]}")
    if args.report:
        Path(args.report).write_text(failures_markdown(groups, text, args, seconds))
        print(f"\nfailures written to {args.report}")
    if args.keep_failing:
        keep = Path(args.keep_failing)
        for case, outs in zip(cases, results):
            if not all(o.ok for o in outs):
                dest = keep / case.ident.replace(":", "_").replace("/", "_")
                if not dest.exists():
                    fz.materialize(case, dest)
        print(f"failing inputs written under {keep}")
    failed = sum(1 for outs in results if not all(o.ok for o in outs))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
