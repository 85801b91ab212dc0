"""What a run's GPUs cost and the energy they draw: the summary's ``cost`` and ``energy`` blocks.

Power is the component-activity model of Hong & Kim ("An Integrated GPU Power and Performance Model",
ISCA 2010) and GPUWattch (Leng et al., MICRO 2013) reduced to two components: a GPU draws its idle
power, plus, for each component, a dynamic power times the share of that component's peak rate the
work uses — the tensor cores' FLOP/s and HBM's bytes/s — never more than its power limit. This
model's one assumption is that either component alone at its full rate would take the board's whole
dynamic range (power limit less idle), so no constant is fitted; the families energy_mlenergy and
energy_mlenergy_diffusion check it against ML.ENERGY's measurements:

    P = idle + (max - idle) * min(1, FLOP/s / peak FLOP/s + HBM bytes/s / peak HBM bytes/s)

Summed over a run that is ``gpus * idle * wall + (max - idle) * (FLOPs / peak + bytes / bandwidth)``
per GPU's share, capped at the power limit over the GPUs' busy time. The run's FLOPs and bytes come
from the engines' own counts (tokens computed, steps run, decode context read) through the cost
model's per-token and per-step work (``LLMCostModel.work_per_step_and_token``). The host's power
per GPU (the server's non-GPU share) is counted over the wall time where the catalog has it; a PUE
multiplies both into ``total_joules``. The per-token, per-request and per-image figures are the GPUs'
energy alone, as the ML.ENERGY benchmark measures it (NVML's GPU energy counters). Costs are GPU-hours at the scenario's price (``cost.gpu_hour``) or its offering's
(``prices.yaml``), over the wall time of the run.
"""

from __future__ import annotations

JOULES_PER_KWH = 3.6e6


def gpu_energy(power, gpus: int, wall: float, busy: float, flops: float, hbm_bytes: float, peak_flops: float,
               hbm_bandwidth: float) -> tuple[float, bool]:
    """Joules ``gpus`` GPUs with ``power`` (a validated PowerSpec) draw over ``wall`` seconds, busy for
    ``busy`` GPU-seconds in all, doing ``flops`` and moving ``hbm_bytes`` (per-GPU peak rates
    ``peak_flops``, ``hbm_bandwidth``); and whether the power limit capped the dynamic part."""
    dynamic_range = power.max - power.idle
    dynamic = dynamic_range * (flops / peak_flops + hbm_bytes / hbm_bandwidth)
    limit = dynamic_range * busy
    return gpus * power.idle * wall + min(dynamic, limit), dynamic > limit


def price_per_gpu_hour(scenario) -> tuple[float | None, str | None]:
    """The scenario's USD per GPU-hour and where it comes from: its own ``cost.gpu_hour``, its
    ``cost.offering``, or its GPU's default offering; (None, None) where none prices it."""
    from ..config import catalog

    c = scenario.cost
    if c.gpu_hour is not None:
        return c.gpu_hour, "cost.gpu_hour"
    name = c.offering or getattr(scenario.hardware.gpu, "offering", None)
    entry = catalog.price(name) if name else None
    if entry is None:
        return None, None
    return entry["usd_per_hour"] / entry["gpus"], name


def blocks(scenario, gpus: int, wall: float, busy: float, flops: float, hbm_bytes: float, peak_flops: float,
           hbm_bandwidth: float, output_tokens: float, total_tokens: float, requests: int,
           unit: str = "output_token") -> dict:
    """The summary's ``cost`` and ``energy`` blocks of a run of ``gpus`` GPUs over ``wall`` seconds
    (``unit``: what the per-item figures count, ``output_token`` for LLM serving, ``image`` for DiT,
    whose ``output_tokens`` is then the images made)."""
    out = {}
    price, source = price_per_gpu_hour(scenario)
    per_hour = price * gpus if price is not None else None
    spent = per_hour * wall / 3600 if per_hour is not None else None
    out["cost"] = {"usd_per_hour": per_hour, "usd_per_gpu_hour": price, "price_source": source, "usd": spent,
                   "usd_per_request": spent / requests if spent is not None and requests else None}
    if unit == "image":
        out["cost"]["usd_per_image"] = spent / output_tokens if spent is not None and output_tokens else None
    else:
        out["cost"]["usd_per_mtok_output"] = spent / output_tokens * 1e6 if spent is not None and output_tokens else None
        out["cost"]["usd_per_mtok_total"] = spent / total_tokens * 1e6 if spent is not None and total_tokens else None
    power = getattr(scenario.hardware.gpu, "power", None)
    if power is None or wall <= 0:
        out["energy"] = None
        return out
    gpu_j, capped = gpu_energy(power, gpus, wall, busy, flops, hbm_bytes, peak_flops, hbm_bandwidth)
    host_j = power.host * gpus * wall if power.host is not None else None
    pue = scenario.cost.pue
    total = (gpu_j + (host_j or 0.0)) * pue
    per = {"image": "joules_per_image"}.get(unit, "joules_per_output_token")
    out["energy"] = {"gpu_joules": gpu_j, "host_joules": host_j, "pue": pue, "total_joules": total,
                     "kwh": total / JOULES_PER_KWH, "gpu_watts_mean": gpu_j / (gpus * wall),
                     per: gpu_j / output_tokens if output_tokens else None,
                     "joules_per_request": gpu_j / requests if requests else None,
                     "power_capped": capped}
    if unit != "image":
        out["energy"]["joules_per_token"] = gpu_j / total_tokens if total_tokens else None
    return out
