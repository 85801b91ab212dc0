"""Readable terminal summaries of a run."""

from __future__ import annotations

import re

from ..kinds import KINDS
from ..observe.records import LLM_CATEGORIES as CATEGORIES, LLM_LAST_MILE as LAST_MILE


def _row(name: str, st: dict) -> str:
    if st.get("mean") is None:
        return f"  {name:<6} {'-':>9} {'-':>9} {'-':>9} {'-':>9}"
    return f"  {name:<6} {st['p50']:>9.2f} {st['p90']:>9.2f} {st['p99']:>9.2f} {st['mean']:>9.2f}"


def _unsigned_zero(text: str) -> str:
    """A figure that rounds to zero read without a sign ("-0.00" is float noise, never a saving)."""
    return text.replace("-", " " if text.startswith(" ") else "", 1) if "-" in text and not any(
        c in text for c in "123456789") else text


def _n(x, spec: str = "", scale: float = 1.0) -> str:
    """A number formatted with ``spec`` after scaling; ``-`` when it is undefined (null)."""
    return "-" if x is None else _unsigned_zero(format(scale * x, spec))


def _pct(x, width: int = 0) -> str:
    """A share as a percentage; ``-`` when undefined (no request completed)."""
    return f"{'-':>{width}} " if x is None else _unsigned_zero(f"{100 * x:{width}.2f}%")


def _engine_time(s: dict) -> list[str]:
    """The share of engine time by activity, and the GPU idle between steps, where the run has them."""
    share, gap = s.get("engine_time_share"), s.get("step_gap_ms")
    if not share:
        return []
    line = (f"  engine time: GPU {_pct(share['gpu'])}, schedule+input prep {_pct(share['schedule'])}, "
            f"output processing {_pct(share['output'])}, API server {_pct(share['api_server'])}")
    if gap and gap.get("mean") is not None:
        line += f"; GPU idle between steps {_n(gap['mean'], '.3f')} ms mean"
    return [line]


UTILIZATION_TRACKS = 12
"""Tracks the utilization line lists one by one; beyond, tracks of one kind are grouped."""


def _utilization(util: dict) -> str:
    """Each track's busy share, or, with many tracks, each kind's (``gpu#``, ``cpu:engine#``, ...)
    count, mean and busiest track, so a line stays a line with hundreds of replicas."""
    if len(util) <= UTILIZATION_TRACKS:
        return ", ".join(f"{k} {_n(v, '.1f', 100)}%" for k, v in util.items())
    groups: dict[str, list] = {}
    for track, share in util.items():
        groups.setdefault(re.sub(r"\d+", "#", track), []).append((share or 0.0, track))
    parts = []
    for kind, items in groups.items():
        top, name = max(items)
        if len(items) == 1:
            parts.append(f"{name} {100 * top:.1f}%")
            continue
        mean = sum(v for v, _ in items) / len(items)
        parts.append(f"{kind} x{len(items)} mean {100 * mean:.1f}% (busiest {name} {100 * top:.1f}%)")
    return ", ".join(parts)


def format_llm(result) -> str:
    """Multi-line text for ``lastmile run`` of kind llm."""
    s = result.summary
    sc = result.scenario
    hw = sc.hardware
    lines = [
        f"lastmile · {s['scenario']} · {sc.model.name} {sc.dtype} on {sc.parallel.replicas}x"
        f"(tp{sc.parallel.tp} pp{sc.parallel.pp}) {hw.gpu.name}",
        f"  serving: engine={sc.serving.engine.name} overlap={sc.serving.overlap} detokenizer={sc.serving.detokenizer} "
        f"api_servers={sc.serving.api_servers} stream_interval={sc.serving.stream_interval} "
        f"max_batch={sc.serving.max_batch}",
        f"  requests: {s['requests_completed']}/{s['requests_total']} completed over {_n(s['duration_s'], '.1f')} s; "
        f"{s['steps']} engine steps; {s['preemptions']} preemptions",
        "",
        f"  {'ms':<6} {'p50':>9} {'p90':>9} {'p99':>9} {'mean':>9}",
        _row("TTFT", s["ttft_ms"]), _row("ITL", s["itl_ms"]),
        *([_row("ITL/tk", s["itl_per_token_ms"])] if s.get("itl_per_token_ms") not in (None, s["itl_ms"]) else []),
        _row("TPOT", s["tpot_ms"]), _row("E2E", s["e2e_ms"]),
        "",
        f"  throughput: {_n(s['throughput']['output_tokens_per_s'], '.1f')} output tok/s, "
        f"{_n(s['throughput']['requests_per_s'], '.2f')} req/s; goodput {_n(s['goodput']['requests_per_s'], '.2f')} req/s "
        f"({_n(s['goodput']['slo_attainment'], '.1f', 100)}% within TTFT<={_n(s['goodput']['slo']['ttft_ms'], 'g')} ms, "
        f"TPOT<={_n(s['goodput']['slo']['tpot_ms'], 'g')} ms"
        + (f", E2E<={_n(s['goodput']['slo']['e2el_ms'], 'g')} ms)" if s['goodput']['slo'].get('e2el_ms') else ")"),
        "",
        "  where E2E goes (share of all requests' time):",
    ]
    share = s["breakdown_share"]
    for c in CATEGORIES:
        tag = "  last mile" if c in LAST_MILE else ""
        bar = "#" * int(round(40 * (share[c] or 0.0)))
        lines.append(f"    {c:<11} {_pct(share[c], 6)}  {bar}{tag}")
    lines += [
        f"  last mile ({'+'.join(LAST_MILE)}): {_pct(s['last_mile_share'])} of E2E, "
        f"{_pct(s['itl_last_mile_share'])} of the inter-token time",
        *_last_mile_cost(s.get("last_mile_cost")),
        "",
        "  utilization: " + _utilization(s["utilization"]),
        *_engine_time(s),
        f"  KV cache: peak {_n(s['kv_cache']['peak_occupancy'], '.1f', 100)}%, mean "
        f"{_n(s['kv_cache']['mean_occupancy'], '.1f', 100)}% of {_n(s['kv_cache']['blocks_per_replica'], ',.0f')} blocks; "
        f"weights {_n(s['memory_per_gpu_gib']['weights_gib'], '.1f')} GiB/GPU",
        *cost_energy_lines(s.get("cost"), s.get("energy")),
    ]
    if s.get("disaggregation"):
        d = s["disaggregation"]
        lines.append(f"  disaggregated: {d['prefill_replicas']} prefill + {d['decode_replicas']} decode replicas; KV "
                     f"over {d['link']} ({d['transfer']}): {_n(d['transfer_ms']['mean'], '.2f')} ms mean, "
                     f"{_n(d['transfer_ms']['p99'], '.2f')} ms p99 per request")
    if s.get("kv_offload"):
        o = s["kv_offload"]
        lines.append(f"  KV offload: {o['loads']:,} loads restored {o['loaded_tokens']:,} tokens; "
                     f"{o['stored_bytes'] / 2**30:,.1f} GiB out, {o['loaded_bytes'] / 2**30:,.1f} GiB back")
    if s.get("prefix_cache"):
        pc = s["prefix_cache"]
        lines.append(f"  prefix cache: {_pct(pc['hit_rate'])} of prompt tokens hit ({_pct(pc['block_hit_rate'])} of "
                     f"blocks), {pc['saved_prefill_tokens']:,} prefill tokens saved, {pc['evicted_units']:,} evictions")
    if s.get("speculative"):
        sp = s["speculative"]
        lines.append(f"  speculative: {sp['tokens']} draft tokens/step, {_n(sp['acceptance_length'], '.2f')} tokens per "
                     f"verify step (expected {sp['expected_tokens_per_step']:.2f}), {_pct(sp['draft_acceptance_rate'])} "
                     "of drafts accepted; ITL per chunk "
                     f"{_n((sp.get('itl_per_chunk_ms') or {}).get('mean'), '.2f')} ms mean")
    lines += _stage_lines(s.get("stages"))
    return "\n".join(lines)


def cost_energy_lines(cost: dict | None, energy: dict | None, unit: str = "output_token",
                      noun: str = "image") -> list[str]:
    """The summary's cost and energy, one line (``observe.energy``); a DiT's per-request figures are per
    ``noun`` (image or video)."""
    parts = []
    if cost and cost.get("usd_per_hour") is not None:
        per = (f"{_n(cost.get('usd_per_image'), '.4g')} USD per {noun}" if unit == "image"
               else f"{_n(cost.get('usd_per_mtok_output'), '.3g')} USD per million output tokens")
        parts.append(f"{_n(cost['usd_per_hour'], '.4g')} USD/h ({cost['price_source']}), {per}")
    elif cost is not None:
        parts.append("no price for this GPU (set cost.gpu_hour)")
    if energy:
        per = energy.get("joules_per_image") if unit == "image" else energy.get("joules_per_output_token")
        parts.append(f"{_n(energy['gpu_watts_mean'], '.0f')} W per GPU, {_n(per, '.3g')} J per "
                     f"{noun if unit == 'image' else 'output token'} (GPUs), {_n(energy['kwh'], '.3g')} kWh in all"
                     + (" (power-capped)" if energy["power_capped"] else ""))
    return [f"  cost: {'; energy: '.join(parts)}"] if parts else []


def _last_mile_cost(cost) -> list[str]:
    """What the counterfactual with the last mile free saves (a line, when the run has one)."""
    if not cost:
        return []

    def saved(metric, stat):
        return _n(cost[metric][stat], '.2f')

    return [f"  last mile made free (same run, same seed) saves: TTFT p50 {saved('ttft_ms', 'p50')} ms, mean ITL "
            f"{saved('itl_ms', 'mean')} ms, mean E2E {saved('e2e_ms', 'mean')} ms ({_pct(cost['e2e_share'])} of E2E); "
            f"throughput {_n(cost['throughput_gain'], '+.1f', 100)}%"]


def _stage_lines(stages) -> list[str]:
    """One line per load stage (requests filed by the stage they arrived in), when there are stages."""
    if not stages:
        return []
    out = ["", f"  {'stage':<6} {'rate/s':>7} {'start s':>8} {'requests':>9} {'TTFT ms':>9} {'TPOT ms':>9} "
                f"{'E2E ms':>9}  (means)"]
    for i, st in enumerate(stages):
        out.append(f"  {i:<6} {_n(st['rate'], '7.2f')} {_n(st['start_s'], '8.1f')} "
                   f"{st['requests_completed']:>4}/{st['requests']:<4} {_n(st['ttft_ms']['mean'], '9.2f')} "
                   f"{_n(st['tpot_ms']['mean'], '9.2f')} {_n(st['e2e_ms']['mean'], '9.1f')}")
    return out


def format_summary(result) -> str:
    """The summary for any kind of run, in its kind's own format (``simulator.kinds``)."""
    return KINDS[result.kind].format(result)
