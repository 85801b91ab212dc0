"""Readable terminal summary of a request-pipeline run (``kind: pipeline``)."""

from __future__ import annotations

from .text import _n, _pct, _row


def format_pipeline(result) -> str:
    """Multi-line text for ``lastmile run`` of kind pipeline: latencies at the client, where E2E goes
    along the critical path, each stage's time and wait, the most frequent critical paths."""
    s = result.summary
    lines = [
        f"lastmile · {s['scenario']} · request pipeline of {len(s['stages'])} stages on "
        f"{len(result.scenario.resources)} resources; output: {s['output_stage']}",
        f"  requests: {s['requests_completed']}/{s['requests_total']} completed over {_n(s['duration_s'], '.2f')} s; "
        f"{_n(s['throughput']['requests_per_s'], '.2f')} req/s",
        "",
        f"  {'ms':<6} {'p50':>9} {'p90':>9} {'p99':>9} {'mean':>9}",
        _row("TTFT", s["ttft_ms"]), _row("E2E", s["e2e_ms"]),
        "",
        "  where E2E goes (critical path; a stage's time includes its queue wait):",
    ]
    for name, share in s["breakdown_share"].items():
        bar = "#" * int(round(40 * (share or 0.0)))
        lines.append(f"    {name:<18} {_pct(share, 6)}  {bar}")
    lines += ["", f"  {'stage':<18} {'resource':<12} {'ran':>6} {'hits':>6} {'time p50':>9} {'p99 ms':>9} "
                  f"{'wait mean':>9} {'critical':>9}"]
    for name, st in s["stages"].items():
        lines.append(f"  {name:<18} {st['resource']:<12} {st['ran']:>6} {st['cache_hits']:>6} "
                     f"{_n(st['time_ms']['p50'], '9.2f')} {_n(st['time_ms']['p99'], '9.2f')} "
                     f"{_n(st['wait_ms']['mean'], '9.2f')} {_pct(st['critical'], 8)}")
    for rname, llm in (s.get("llm") or {}).items():
        share = llm["breakdown_share"] or {}
        top = ", ".join(f"{c} {_pct(v)}" for c, v in share.items() if v)
        lines += ["", f"  llm {rname}: {llm['calls_completed']}/{llm['calls']} calls; TTFT p50 "
                      f"{_n((llm['ttft_ms'] or {}).get('p50'), '.2f')} ms, E2E p50 {_n((llm['e2e_ms'] or {}).get('p50'), '.1f')} ms"
                      + (f"; prefill saved by the prefix cache: {llm['prefix_saved_tokens']:,} tokens" if llm["prefix_saved_tokens"] else ""),
                  f"    its calls' time: {top or '-'}; last mile {_pct(llm['last_mile_share'])}"]
    for rname, dit in (s.get("dit") or {}).items():
        share = dit["breakdown_share"] or {}
        top = ", ".join(f"{c} {_pct(v)}" for c, v in share.items() if v)
        lines += ["", f"  dit {rname}: {dit['calls_completed']}/{dit['calls']} images; latency p50 "
                      f"{_n(dit['latency_ms']['p50'], '.1f')} ms (queue included)",
                  f"    its images' time: {top or '-'}; last mile {_pct(dit['last_mile_share'])}"]
    lines += ["", "  critical paths:"]
    for cp in s["critical_paths"]:
        lines.append(f"    {_pct(cp['share'], 6)}  {cp['path']}")
    return "\n".join(lines)
