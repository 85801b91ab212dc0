"""``lastmile catalog``: what a scenario can name (GPUs, links, CPU profiles, LLMs, DiTs), with key figures.

The figures are read from the shipped catalog (``simulator/config/catalog/*.yaml``) and printed in
readable units; the sources of each figure stay in those files.
"""

from __future__ import annotations

from ..config import catalog
from ..units import parse

HELP = "list what a scenario can name: gpus, links, models (LLMs), dits, cpus, engines, nodes, with key figures"

SECTIONS = ("gpus", "links", "models", "dits", "cpus", "engines", "nodes")


def _q(value, dimension: str) -> float:
    return parse(value, dimension)


def _count(n: float) -> str:
    """A parameter count as 8.0 B or 610 M."""
    return f"{n / 1e9:.1f} B" if n >= 1e9 else f"{n / 1e6:.0f} M"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A plain text table: the name left-aligned, the figures right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: list) -> str:
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)])


def gpus() -> str:
    """Memory, HBM bandwidth, BF16/FP8 peak, SMs and the default links of each GPU."""
    rows = []
    for name in catalog.names("gpus"):
        e = catalog.entry("gpus", name)
        flops = e.get("peak_flops", {})
        rows.append([name, f"{_q(e['memory'], 'bytes') / 1e9:.0f} GB",
                     f"{_q(e['hbm_bandwidth'], 'bandwidth') / 1e12:.2f} TB/s",
                     f"{_q(flops['bf16'], 'flops') / 1e12:.0f}" if "bf16" in flops else "-",
                     f"{_q(flops['fp8'], 'flops') / 1e12:.0f}" if "fp8" in flops else "-",
                     str(e.get("sm_count", "-")), e.get("gpu_link") or "none", e.get("host_link", "")])
    return _table(["gpu", "memory", "HBM", "bf16 TFLOPS", "fp8 TFLOPS", "SMs", "gpu_link", "host_link"], rows)


def links() -> str:
    """Bandwidth per direction, achievable fraction and one-way latency of each link."""
    rows = []
    for name in catalog.names("links"):
        e = catalog.entry("links", name)
        bw = _q(e["bandwidth"], "bandwidth")
        busbw = e.get("allreduce_busbw")
        rows.append([name, f"{bw / 1e9:.4g} GB/s", f"{e.get('achievable', 1.0):g}",
                     f"{_q(e['latency'], 'time') * 1e6:.3g} us",
                     f"{_q(busbw, 'bandwidth') / 1e9:.4g} GB/s" if busbw else "-"])
    return _table(["link", "bandwidth", "achievable", "latency", "all-reduce busbw"], rows)


def models() -> str:
    """Layers, hidden size, heads, experts, context and parameter count of each LLM."""
    from ..config.models import LLMSpec
    from ..workloads.llm import LLMShape

    rows = []
    for name in catalog.names("llms"):
        e = catalog.entry("llms", name)
        shape = LLMShape.from_spec(LLMSpec.model_validate(e))
        experts = f"{e.get('experts', 1)} (top {e.get('top_k', 1)})" if e.get("experts", 1) > 1 else "-"
        rows.append([name, str(e["layers"]), str(e["hidden"]), f"{e['heads']}/{e['kv_heads']}", experts,
                     str(e.get("context_length", "-")), _count(shape.params())])
    return _table(["model", "layers", "hidden", "heads/kv", "experts", "context", "params"], rows)


def dits() -> str:
    """DiTs (blocks, hidden, heads, text mode, parameters) and the text encoders and VAEs they use."""
    rows = []
    for name in catalog.names("dits"):
        e = catalog.entry("dits", name)
        kind = e.get("kind", "dit")
        blocks = e.get("blocks") or "+".join(str(e.get(k, 0)) for k in ("double_blocks", "single_blocks"))
        if kind == "vae":
            blocks = f"{len(e.get('block_out_channels', []))} levels"
        elif kind == "text_encoder":
            blocks = e.get("layers", "-")
        params = e.get("params")
        rows.append([name, kind, str(blocks), str(e.get("hidden", "-")), str(e.get("heads", "-")),
                     e.get("text_mode", "-"), _count(float(params)) if params else "-"])
    return _table(["name", "kind", "blocks/layers", "hidden", "heads", "text_mode", "params"], rows)


def cpus() -> str:
    """Each CPU cost profile's per-token and per-step costs."""
    keys = ("tokenize_per_token", "detokenize_per_token", "output_per_request", "stream_per_chunk",
            "schedule_per_step", "schedule_per_request", "request_overhead")
    rows = []
    for name in catalog.names("cpus"):
        e = catalog.entry("cpus", name)
        for k in keys:
            rows.append([name, k, f"{_q(e[k], 'time') * 1e6:.3g} us"] if k in e else [name, k, "-"])
    return _table(["profile", "cost", "value"], rows) + "\n\nMeasure your own with `lastmile measure-cpu`."


def engines() -> str:
    """Each engine profile: its release, CPU costs and the serving settings it defaults to."""
    rows = []
    for name in catalog.names("engines"):
        e = catalog.entry("engines", name)
        sv = e.get("serving") or {}
        rows.append([name, e.get("cpu", "reference"), sv.get("overlap", "sync"), sv.get("detokenizer", "engine"),
                     sv.get("api_server_process", "own"), str(e.get("version", ""))[:48]])
    return _table(["engine", "cpu", "overlap", "detokenizer", "api server", "version"], rows)


def nodes() -> str:
    """Each node type: its GPUs, NVLink domain, PCIe switches and sockets, peer-to-peer rule and NICs."""
    rows = []
    for name in catalog.names("nodes"):
        e = catalog.entry("nodes", name)
        rows.append([name, f"{e['gpus']}x {e['gpu']}", e.get("nvlink") or "none", str(e.get("nvlink_domain", "")),
                     str(e.get("gpus_per_switch", 0) or "root ports"), str(e.get("sockets", 1)),
                     e.get("p2p", "switch"), f"{e.get('nics', 0)}x {e.get('nic') or '-'}"])
    return _table(["node", "gpus", "nvlink", "domain", "gpus/switch", "sockets", "p2p", "nics"], rows)


def add_arguments(p) -> None:
    p.add_argument("section", nargs="?", choices=SECTIONS, help="what to list (default: all)")


def main(args) -> int:
    sections = [args.section] if args.section else list(SECTIONS)
    parts = []
    for s in sections:
        title = f"{s} (hardware.gpu)" if s == "gpus" else {
            "links": "links (hardware.gpu_link, host_link, node_link, client_link)",
            "models": "models (model, kind llm)", "dits": "dits (model, kind dit)",
            "cpus": "cpus (hardware.cpu)", "engines": "engines (serving.engine)",
            "nodes": "nodes (hardware.node)"}[s]
        parts.append(f"{title}\n\n{globals()[s]()}" if not args.section else globals()[s]())
    print("\n\n".join(parts))
    return 0
