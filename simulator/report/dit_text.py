"""Readable terminal summary of a DiT or token-pipeline run."""

from __future__ import annotations

from ..observe.records import DIT_CATEGORIES, DIT_LAST_MILE
from ..units import fmt_time
from .text import cost_energy_lines



def _t(x) -> str:
    return "-" if x is None else fmt_time(x)


def _n(x, spec: str = "", scale: float = 1.0) -> str:
    """A number formatted with ``spec`` after scaling; ``-`` when it is undefined (null)."""
    return "-" if x is None else format(scale * x if scale != 1.0 else x, spec)


def _pct(x, width: int = 0) -> str:
    """A share as a percentage; ``-`` when undefined (no image completed)."""
    return f"{'-':>{width}} " if x is None else f"{round(100 * x, 1) + 0.0:>{width}.1f}%"


def format_dit(result) -> str:
    """Multi-line text for ``lastmile run`` of kind dit."""
    s = result.summary
    frames = f" x {s['frames']} frames" if s.get("frames") else ""
    head = (f"{s['scenario']}: {s.get('model', '')} {s.get('resolution', '')}{frames} "
            f"{s.get('steps', '')} steps on {s.get('gpus', '?')} x {s.get('gpu', '')} "
            f"[{s.get('strategy', '')}]")
    if s.get("status") == "oom":
        return (f"{head}\nstatus: OUT OF MEMORY: needs {_n(s['memory_needed_gib'], '.1f')} GiB per GPU, "
                f"the GPU has {_n(s['gpu_memory_gib'], '.1f')} GiB")
    lat = s["latency_s"]
    noun = "video" if s.get("frames") else "image"
    lines = [head, f"status: {s['status']}   requests: {s['requests_completed']}/"
             f"{s.get('requests_total', s['requests_completed'])}   "
             f"throughput: {_n(s['throughput']['images_per_s'], '.3f')} {noun}s/s   "
             f"memory per GPU: {_n(s['memory_per_gpu_gib'], '.1f')} GiB",
             f"latency  p50 {_t(lat['p50'])}  p90 {_t(lat['p90'])}  p99 {_t(lat['p99'])}  "
             f"mean {_t(lat['mean'])}", "", f"{'category':<12} {'mean':>10} {'share':>7}"]
    bd = result.breakdown
    for c in DIT_CATEGORIES:
        mean = _t(float(bd[c].mean())) if len(bd) else "-"
        lines.append(f"{c:<12} {mean:>10} {_pct(s['breakdown_share'][c], 6)}")
    lines.append(f"last mile ({' + '.join(DIT_LAST_MILE)}): {_pct(s['last_mile_share'])} of latency")
    gpu_util = s.get("utilization", {}).get("gpu", {})
    if gpu_util:
        lines.append("GPU utilization: " + "  ".join(f"{k} {_n(v, '.0f', 100)}%"
                                                     for k, v in gpu_util.items()))
    lines.extend(_serving_lines(s))
    lines.extend(line.strip() for line in cost_energy_lines(s.get("cost"), s.get("energy"), unit="image", noun=noun))
    return "\n".join(lines)


def _serving_lines(s: dict) -> list[str]:
    """The service's passes (when it batched, preempted or served several shapes) and its goodput."""
    sv, out = s.get("serving") or {}, []
    if sv and ((sv.get("max_batch") or 1) > 1 or sv.get("preempt") or (sv.get("shapes") or 1) > 1):
        out.append(f"serving: {sv.get('policy')}, {_n(sv.get('passes'))} passes of {_n(sv.get('batch_mean'), '.2f')} "
                   f"requests on average (at most {_n(sv.get('batch_max'))} of {_n(sv.get('max_batch'))}), "
                   f"{_n(sv.get('preemptions'))} preemptions, {_n(sv.get('shapes'))} request shapes")
    g = s.get("goodput")
    if g:
        out.append(f"goodput: {_n(g.get('images_per_s'), '.3f')} requests/s within "
                   f"{_t((g.get('slo') or {}).get('latency_s'))} ({_pct(g.get('slo_attainment'))} of completed requests)")
    return out


def format_token(result) -> str:
    """Multi-line text for ``lastmile run`` of kind token_pipeline."""
    s = result.summary
    kind = "causal LLM" if s["causal"] else "DiT (bidirectional, stale K/V)"
    lines = [f"{s['scenario']}: {s['model']} ({kind}), {s['sequence_tokens']} tokens, "
             f"{s['stages']} stages, {s['slices']} {s['slicing']} slices",
             f"latency {_t(s['latency_s']['p50'])}   bubble {_n(s['bubble_fraction'], '.1f', 100)}%"
             f"   slice cost max/min {_n(s['slice_cost_spread'], '.2f')}",
             "slice tokens: " + ", ".join(str(x) for x in s["slice_tokens"]),
             "stage utilization: " + "  ".join(f"{k} {_n(v, '.0f', 100)}%"
                                               for k, v in s["utilization"]["gpu"].items())]
    return "\n".join(lines)
