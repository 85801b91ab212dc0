"""``lastmile plan``: search deployments for the cheapest that meets an SLO; a ranked table, the
Pareto front of cost against p99 TTFT, and the winner written as a scenario ``lastmile run`` takes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import ConfigError

HELP = "find the cheapest deployment (GPU x TP x replicas x engine) that meets an SLO, by simulation"

DEFAULT_REQUESTS = 1000
"""Requests per probe: enough that a rate beyond capacity builds a queue the p99 sees (on the default
scenario a 300-request probe met a 500 ms / 50 ms SLO at 23.4 req/s, where 1,000 requests at 23 req/s
miss it, p99 TPOT 84 ms, and the sustained rate is about 17.5 req/s)."""

TABLE = ("candidate", "status", "max_rate_per_s", "usd_per_hour", "usd_per_mtok", "j_per_token", "ttft_p99_ms",
         "tpot_p99_ms", "last_mile_share", "last_mile_e2e_ms")


def add_arguments(p) -> None:
    p.add_argument("scenario", nargs="?", help="scenario YAML file whose model and workload are planned for "
                                               "(default: the built-in default scenario)")
    p.add_argument("--slo", action="append", default=[], metavar="KEY=VALUE",
                   help="a latency objective: ttft_p99=500ms, tpot_p99=50ms, e2e_p99=10s (repeatable)")
    p.add_argument("--goodput", type=float, help="also require this share of requests within the TTFT and TPOT "
                                                 "objectives (e.g. 0.99)")
    p.add_argument("--gpu", default="h100-sxm", help="GPU types to search, comma-separated (default h100-sxm)")
    p.add_argument("--node", default="", help="node types to search instead of bare GPUs, comma-separated "
                                              "(each names its GPU)")
    p.add_argument("--tp", default="1,2,4,8", help="TP degrees, comma-separated (default 1,2,4,8)")
    p.add_argument("--replicas", default="1,2,4,8", help="replica counts, comma-separated (default 1,2,4,8)")
    p.add_argument("--engine", default="vllm-v1", help="engine profiles, comma-separated (default vllm-v1)")
    p.add_argument("--api-servers", default="", help="API-server processes per deployment, comma-separated "
                                                     "(default: the scenario's): what a second API server buys "
                                                     "against another GPU")
    p.add_argument("--pd", default="", metavar="P:D,...",
                   help="disaggregated layouts to search too: prefill:decode replicas, each of TP GPUs (e.g. 1:1,1:2)")
    p.add_argument("--max-batch", default="", help="batch limits (serving.max_batch), comma-separated "
                                                   "(default: the scenario's)")
    count = p.add_mutually_exclusive_group()
    count.add_argument("--gpus", type=int, help="hold the GPU count fixed: TP x replicas = N")
    count.add_argument("--max-gpus", type=int, help="at most N GPUs per candidate")
    p.add_argument("--budget", type=float, metavar="USD_PER_HOUR", help="leave out candidates dearer than this")
    p.add_argument("--min-rate", type=float, default=0.0, metavar="PER_S",
                   help="prune candidates whose roofline bound is below this request rate")
    p.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help=f"requests per probe (default {DEFAULT_REQUESTS})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key for every candidate (repeatable)")
    p.add_argument("--out", default="runs/plan", help="folder for plan.csv, plan.jsonl (the resumable results), "
                                                      "pareto.png and winner.yaml (default runs/plan)")
    p.add_argument("--workers", type=int, help="local worker processes (default: all cores)")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT", help="run the candidates on this Dask scheduler")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


def _list(text: str, flag: str, cast=str) -> list:
    values = [v.strip() for v in text.split(",") if v.strip()]
    try:
        return [cast(v) for v in values]
    except ValueError:
        raise ConfigError(f"expected comma-separated {cast.__name__} values, got {text!r}", file=flag) from None


def _splits(text: str) -> list[tuple[int, int]]:
    out = []
    for item in _list(text, "--pd"):
        p, sep, d = item.partition(":")
        if not (sep and p.isdigit() and d.isdigit() and int(p) > 0 and int(d) > 0):
            raise ConfigError(f"expected prefill:decode replica counts like 1:2, got {item!r}", file="--pd")
        out.append((int(p), int(d)))
    return out


def parse_slo(items: list[str], goodput: float | None):
    """``--slo`` items -> an :class:`~simulator.plan.SLO` (seconds inside)."""
    from ..plan import SLO, SLO_KEYS
    from ..units import parse
    from ..errors import UnitError

    values = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in SLO_KEYS:
            raise ConfigError(f"expected KEY=VALUE with KEY one of {', '.join(SLO_KEYS)}, got {item!r}", file="--slo")
        try:
            seconds = parse(value.strip(), "time")
        except UnitError as exc:
            raise ConfigError(f"{key}: {exc}", file="--slo") from None
        if not seconds > 0:
            raise ConfigError(f"{key} must be positive, got {value!r}", file="--slo")
        values[key] = seconds
    if not values:
        raise ConfigError("name at least one objective, e.g. --slo ttft_p99=500ms --slo tpot_p99=50ms", file="--slo")
    if goodput is not None and not 0 < goodput <= 1:
        raise ConfigError(f"a goodput share is in (0, 1], got {goodput}", file="--goodput")
    return SLO(**values, goodput=goodput)


def _hardware(args) -> list[tuple[str, str | None]]:
    """(GPU, node) pairs to search, each checked against the catalog."""
    from ..config import catalog

    if args.node:
        out = []
        for node in _list(args.node, "--node"):
            spec = catalog.entry("nodes", node)
            if spec is None:
                raise ConfigError(f"unknown node type {node!r}; known: {', '.join(catalog.names('nodes'))}", file="--node")
            out.append((spec["gpu"], node))
        return out
    gpus = _list(args.gpu, "--gpu")
    for gpu in gpus:
        if catalog.entry("gpus", gpu) is None:
            raise ConfigError(f"unknown GPU {gpu!r}; known: {', '.join(catalog.names('gpus'))}", file="--gpu")
    return [(g, None) for g in gpus]


def _jobs(args, slo):
    """Every candidate's job (what ``plan.evaluate`` takes), the base scenario and the plan's overrides,
    each flag checked first."""
    from dataclasses import asdict

    from ..config import catalog
    from ..config.loader import load_raw, parse_override
    from ..plan import candidates

    engines = _list(args.engine, "--engine")
    for engine in engines:
        if catalog.entry("engines", engine) is None:
            raise ConfigError(f"unknown engine profile {engine!r}; known: {', '.join(catalog.names('engines'))}",
                              file="--engine")
    if not 1 <= args.requests <= 1_000_000:
        raise ConfigError(f"requests per probe are between 1 and 1,000,000, got {args.requests}", file="--requests")
    for flag, n in (("--gpus", args.gpus), ("--max-gpus", args.max_gpus)):
        if n is not None and not 1 <= n <= 100_000:
            raise ConfigError(f"a GPU count is between 1 and 100,000, got {n}", file=flag)
    space = candidates(_hardware(args), _list(args.tp, "--tp", int), _list(args.replicas, "--replicas", int),
                       engines, args.gpus, args.max_gpus,
                       _list(args.api_servers, "--api-servers", int) or [None],
                       _list(args.max_batch, "--max-batch", int) or [None], _splits(args.pd))
    base = load_raw(args.scenario)[0] if args.scenario else None
    overrides = dict(parse_override(o) for o in args.overrides)
    return [{"base": args.scenario, "overrides": overrides, "candidate": asdict(c), "slo": asdict(slo),
             "requests": args.requests, "min_rate": args.min_rate} for c in space], base, overrides


def main(args) -> int:
    from ..plan import Outcome, evaluate, settings_key
    from ..sweep import completed, connect

    slo = parse_slo(args.slo, args.goodput)
    if args.workers is not None and not 1 <= args.workers <= 1024:
        raise ConfigError(f"worker processes are between 1 and 1024, got {args.workers}", file="--workers")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ConfigError("is a file; name a folder for the plan's files", file=f"--out {args.out}")
    jobs, base, overrides = _jobs(args, slo)
    from ..api import load_scenario

    if load_scenario(args.scenario, overrides).kind != "llm":  # a bad scenario or --set: one line now
        raise ConfigError("lastmile plan searches LLM serving deployments (kind: llm)", file=args.scenario)
    key = settings_key({"scenario": base, "overrides": overrides}, slo, args.requests)
    out.mkdir(parents=True, exist_ok=True)
    done = _resume(out / "plan.jsonl", key)
    todo = [j for j in jobs if _key(j["candidate"]) not in done]
    _progress(args, f"lastmile plan: {len(jobs)} candidates, {len(jobs) - len(todo)} from {out / 'plan.jsonl'}")
    client = connect(args.scheduler) if args.scheduler else None
    try:
        for _, outcome in completed(evaluate, todo, client, args.workers):
            done[_key(outcome["candidate"])] = outcome
            with open(out / "plan.jsonl", "a") as f:
                f.write(json.dumps({"settings": key, "outcome": outcome}) + "\n")
            o = Outcome.from_json(outcome)
            _progress(args, f"  {o.candidate.label}: {o.status}" + (f", {o.rate:.3g} req/s" if o.summary else ""))
    finally:
        if client is not None:
            client.close()
    outcomes = [Outcome.from_json(done[_key(j["candidate"])]) for j in jobs]
    return _report(outcomes, args, out, slo, overrides)


def _key(candidate: dict) -> str:
    """A candidate's key in the results file and in the outcomes found so far."""
    return json.dumps(candidate, sort_keys=True)


def _progress(args, line: str) -> None:
    """A progress line on stderr, unless --no-progress or -q."""
    from .. import progress

    if not args.no_progress and progress.level() != progress.QUIET:
        print(line, file=sys.stderr, flush=True)


def _resume(path: Path, key: str) -> dict:
    """Outcomes a previous search with the same settings wrote (an interrupted search goes on from them)."""
    done = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by an interruption
            if rec.get("settings") == key:
                done[_key(rec["outcome"]["candidate"])] = rec["outcome"]
    return done


def _report(outcomes, args, out: Path, slo, overrides: dict) -> int:
    """Rank the candidates that met the SLO by cost per million output tokens (the higher rate first
    where equal), mark the Pareto front of cost against p99 TTFT, print and write the table, draw
    the front and write the winner."""
    import pandas as pd

    from ..plan import pareto
    from ..report import plots

    rows = [o.row() for o in outcomes]
    if args.budget is not None:
        for r in rows:
            if r["status"] == "ok" and r["usd_per_hour"] is not None and r["usd_per_hour"] > args.budget:
                r["status"] = f"over budget: {r['usd_per_hour']:.4g} USD/h > {args.budget:g}"
    met = sorted((i for i, r in enumerate(rows) if r["status"] == "ok"),
                 key=lambda i: (_or_inf(rows[i]["usd_per_mtok"]), -rows[i]["max_rate_per_s"]))
    ranked = [rows[i] for i in met]
    for k, r in enumerate(ranked, 1):
        r["rank"] = k
    front = set(pareto(ranked))
    for k, r in enumerate(ranked):
        r["pareto"] = k in front
    df = pd.DataFrame(ranked + [r for i, r in enumerate(rows) if i not in set(met)])
    df.to_csv(out / "plan.csv", index=False)
    with pd.option_context("display.max_columns", None, "display.width", 250, "display.float_format", "{:.4g}".format,
                           "display.max_colwidth", 70):
        print(df[[c for c in ("rank", *TABLE) if c in df.columns]].to_string(index=False))
    if not ranked:
        print(f"\nno candidate meets {_slo_text(slo)}; wrote {out / 'plan.csv'}")
        return 1
    plots.save(plots.pareto_figure(pd.DataFrame(ranked)), out / "pareto.png")
    winner = outcomes[met[0]]
    _write_winner(winner, args, out / "winner.yaml", slo, overrides)
    cost = ranked[0]["usd_per_mtok"]
    print(f"\nwinner: {winner.candidate.label} at {winner.rate:.3g} req/s"
          + (f", {cost:.3g} USD per million output tokens" if cost is not None else "")
          + f"; wrote {out / 'plan.csv'}, {out / 'pareto.png'}, {out / 'winner.yaml'} (lastmile run {out / 'winner.yaml'})")
    return 0


def _or_inf(x):
    return float("inf") if x is None else x


def _slo_text(slo) -> str:
    parts = [f"{k}={getattr(slo, k) * 1e3:g} ms" for k in ("ttft_p99", "tpot_p99", "e2e_p99") if getattr(slo, k)]
    if slo.goodput is not None:
        parts.append(f"goodput {slo.goodput:g}")
    return " ".join(parts)


def _write_winner(winner, args, path: Path, slo, overrides: dict) -> None:
    """The winner as a scenario: the base scenario with the plan's and the candidate's overrides at its
    highest rate, the probe's size and the SLO (``lastmile run`` reproduces the probe exactly)."""
    from dataclasses import asdict

    import yaml

    from ..api import load_scenario
    from ..config.loader import load_raw, set_path
    from ..plan import probe_overrides
    from ..runfolder import write_atomically

    job = {"overrides": overrides, "requests": args.requests, "slo": asdict(slo)}
    raw, _, base_dir = load_raw(args.scenario)
    for key, value in probe_overrides(job, winner.candidate, winner.rate).items():
        set_path(raw, key, value)
    _absolute_paths(raw, base_dir)
    raw["name"] = f"plan-winner-{winner.candidate.label.replace(' ', '-')}"
    load_scenario(raw)  # what is written loads as it is
    write_atomically(path, "# written by lastmile plan: its winner at its highest rate that met the SLO\n"
                     + yaml.safe_dump(raw, sort_keys=False))


PATH_KEYS = (("workload", "trace"), ("workload", "tokenizer"), ("model",))
"""Keys of a scenario that may name a file relative to it: the winner, written elsewhere, names them whole."""


def _absolute_paths(raw: dict, base_dir: Path) -> None:
    for keys in PATH_KEYS:
        node = raw
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        value = node.get(keys[-1]) if isinstance(node, dict) else None
        if isinstance(value, str) and not Path(value).is_absolute() and (base_dir / value).exists():
            node[keys[-1]] = str((base_dir / value).resolve())
