"""Where an LLM deployment's replicas sit and whether they fit: the parallel layout's checks, one
replica's step-cost model, the KV-cache blocks left after weights and activations, and the pools
(one co-located pool, or a prefill and a decode pool) a deployment is built from."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import ConfigError
from ...hardware.allreduce import allreduce_link
from ...hardware.gpu import GPU
from ...hardware.topology import LinkParams
from ...units import fmt_bytes
from ...workloads.llm import DecodeAttentionKernel, LLMCostModel, LLMShape
from .speculative import SPEC_METHODS
from .run_support import declare

# How closed-form runs of steps cover the serving keys this module owns (run_support).
declare("gpu_memory_utilization", owner="pools")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_parallel(scenario) -> None:
    """TP must split the heads evenly; a replica's GPUs beyond one node need a node link."""
    m, p, hw = scenario.model, scenario.parallel, scenario.hardware
    if p.dp_attention and not p.expert_parallel:
        raise ConfigError("parallel.dp_attention runs the MoE layers expert-parallel across the ranks: set "
                          "parallel.expert_parallel: true", path="parallel.dp_attention")
    if not p.dp_attention and m.heads % p.tp:  # under DP attention each rank holds attention whole
        raise ConfigError(f"tp={p.tp} does not divide the {m.heads} attention heads of {m.name}; "
                          f"use one of {', '.join(map(str, _divisors(m.heads)))}", path="parallel.tp")
    if not p.dp_attention and m.kv_heads % p.tp and p.tp % m.kv_heads:
        raise ConfigError(f"tp={p.tp} neither divides nor is a multiple of the {m.kv_heads} KV heads",
                          path="parallel.tp")
    if p.pp > m.layers:
        raise ConfigError(f"pp={p.pp} exceeds the model's {m.layers} layers", path="parallel.pp")
    if p.expert_parallel and m.experts == 1:
        raise ConfigError(f"{m.name} is dense: expert parallelism needs an MoE; drop parallel.expert_parallel",
                          path="parallel.expert_parallel")
    if (p.expert_skew or p.eplb or p.redundant_experts) and not p.expert_parallel:
        key = "expert_skew" if p.expert_skew else ("eplb" if p.eplb else "redundant_experts")
        raise ConfigError("spreads experts over expert-parallel ranks: set parallel.expert_parallel: true",
                          path=f"parallel.{key}")
    if p.redundant_experts and not p.eplb:
        raise ConfigError("redundant experts are EPLB's replicas: set parallel.eplb: true",
                          path="parallel.redundant_experts")
    if p.eplb and (m.experts + p.redundant_experts) % p.tp:
        raise ConfigError(f"{m.experts} experts + {p.redundant_experts} redundant do not fill the {p.tp} ranks "
                          "evenly (vLLM needs the physical experts to divide by the EP size)",
                          path="parallel.redundant_experts")
    if p.expert_parallel and m.experts % p.tp:
        raise ConfigError(f"tp={p.tp} does not split the {m.experts} experts of {m.name} whole; use one of "
                          f"{', '.join(map(str, _divisors(m.experts)))}", path="parallel.tp")
    if p.tp * p.pp > hw.gpus_per_node and hw.node_link is None:
        raise ConfigError(f"a replica needs {p.tp * p.pp} GPUs but a node has {hw.gpus_per_node}; "
                          "set hardware.node_link (e.g. ib-400g)", path="hardware.node_link")


class DoesNotFit(Exception):
    """A layout whose model, activations or longest request do not fit in GPU memory: an outcome of
    the run (``status: oom``, as for DiT layouts), not an input error, so a sweep keeps its row."""

    def __init__(self, message: str, key: str, memory: dict):
        super().__init__(message)
        self.message, self.key, self.memory = message, key, memory


def kv_capacity(scenario, cost: LLMCostModel, layout: tuple[str, ...] = ("parallel.tp", "parallel.pp")) -> tuple[int, dict]:
    """KV-cache blocks per replica after weights and activations; DoesNotFit if the model does not fit,
    naming the ``layout`` keys that spread the model over more GPUs."""
    sv, gpu = scenario.serving, scenario.hardware.gpu
    weights = cost.weight_bytes_per_gpu()
    kv_token = cost.kv_bytes_per_token_per_gpu()
    if sv.speculative is not None:  # the drafter's weights and KV cache share the GPUs' memory
        drafter_weights, drafter_kv = SPEC_METHODS[sv.speculative.method].build(scenario, cost).memory()
        weights += drafter_weights
        kv_token += drafter_kv
    act = cost.peak_activation_bytes(sv.max_batched_tokens, sv.max_batch)
    act_logits = cost.peak_activation_bytes(0, sv.max_batch)
    act_tokens = act - act_logits
    usable = gpu.memory * sv.gpu_memory_utilization
    kv_bytes = usable - weights - act - cost.sliding_kv_bytes(sv.max_batch, sv.block_size)
    memory = {"weights_gib": weights / 2**30, "activations_gib": act / 2**30,
              "kv_cache_gib": max(kv_bytes, 0) / 2**30, "capacity_gib": gpu.memory / 2**30}
    if cost.shape.sliding_layers:
        memory["sliding_kv_gib"] = cost.sliding_kv_bytes(sv.max_batch, sv.block_size) / 2**30
    if kv_bytes <= 0:
        budget = f"exceed {sv.gpu_memory_utilization:g} x {fmt_bytes(gpu.memory)}"
        if weights >= usable:
            raise DoesNotFit(f"{scenario.model.name} does not fit: {fmt_bytes(weights)} of weights per GPU {budget}; "
                             f"raise {' or '.join(layout)}, or use a larger GPU", "hardware.gpu.memory", memory)
        # the weights fit: the batch's activations (sized by the token budget and the batch) tip it over
        key = "serving.max_batched_tokens" if act_tokens >= act_logits else "serving.max_batch"
        raise DoesNotFit(f"{fmt_bytes(weights)} of weights + {fmt_bytes(act)} of activations per GPU {budget}; "
                         f"lower {key}, raise {layout[0]}, or use a larger GPU", key, memory)
    per_block = kv_token * sv.block_size
    return int(kv_bytes // per_block), memory


def check_requests_fit(scenario, kv_blocks: int, longest: int, longest_prompt: int, key: str, memory: dict) -> None:
    """Every request must be able to run alone: its prompt and output fit the KV cache and the batch budget.

    ``longest`` / ``longest_prompt`` bound the workload's requests; ``key`` is where they come from.
    """
    sv = scenario.serving
    blocks = math.ceil(longest / sv.block_size)
    if blocks > kv_blocks:
        raise DoesNotFit(f"a request of {longest} tokens needs {blocks} KV blocks but the cache holds "
                         f"{kv_blocks}; lower the token counts or add GPUs", key, memory)
    if not sv.chunked_prefill and longest_prompt > sv.max_batched_tokens:
        raise ConfigError(f"prompts of up to {longest_prompt} tokens exceed max_batched_tokens="
                          f"{sv.max_batched_tokens} without chunked prefill; set serving.chunked_prefill: true",
                          path="serving.max_batched_tokens")


def build_cost(scenario) -> LLMCostModel:
    """The step-cost model of one replica (its closed-form communication on the GPUs' peer link)."""
    hw, p = scenario.hardware, scenario.parallel
    spec = hw.gpu_link or hw.host_link
    link = LinkParams.from_spec(spec)
    gpu = GPU.from_spec(hw.gpu)
    attention = DecodeAttentionKernel.from_catalog(scenario.serving.decode_attention, gpu)
    return LLMCostModel(LLMShape.from_spec(scenario.model), gpu, scenario.dtype, p.tp, p.pp, link.bandwidth,
                        link.latency, allreduce_link(spec, _tp_group(scenario)), p.allreduce, attention,
                        step_time=hw.step_time, expert_parallel=p.expert_parallel, dp_attention=p.dp_attention,
                        expert_skew=p.expert_skew, eplb=p.eplb, redundant_experts=p.redundant_experts)


def _tp_group(scenario):
    """Replica 0's TP group as NCCL sees it on the node type's topology (None without a node type)."""
    hw, p = scenario.hardware, scenario.parallel
    if hw.node is None or p.tp < 2:
        return None
    from ...hardware.nccl import group_on

    return group_on(hw, range(p.tp))


@dataclass
class PoolPlan:
    """One pool of engine replicas: ``role`` both (co-located), prefill or decode; the scenario
    with the pool's parallelism; its step-cost model and KV blocks per replica; where its
    replicas and GPUs start in the deployment's numbering."""

    role: str
    scenario: object
    cost: LLMCostModel
    kv_blocks: int
    memory: dict
    first_replica: int = 0
    first_gpu: int = 0

    @property
    def replicas(self) -> int:
        return self.scenario.parallel.replicas

    @property
    def gpus_per_replica(self) -> int:
        p = self.scenario.parallel
        return p.tp * p.pp


def plan_pools(scenario) -> list[PoolPlan]:
    """The deployment's pools: one co-located pool, or a prefill and a decode pool. A co-located
    layout that does not fit raises DoesNotFit (a run outcome); a disaggregated pool that does
    not fit is a configuration error naming the pool."""
    dis = scenario.disaggregation
    if dis is None:
        cost = build_cost(scenario)
        kv_blocks, memory = kv_capacity(scenario, cost)
        return [PoolPlan("both", scenario, cost, kv_blocks, memory)]
    hw = scenario.hardware
    gpus = dis.prefill.replicas * dis.prefill.tp + dis.decode.replicas * dis.decode.tp
    if dis.kv_link is None and hw.node_link is None and gpus > hw.gpus_per_node:
        raise ConfigError(f"the prefill and decode pools take {gpus} GPUs, more than a node's {hw.gpus_per_node}, so "
                          "their KV crosses nodes: set disaggregation.kv_link (e.g. ib-400g) or hardware.node_link",
                          path="disaggregation.kv_link")
    plans, replica, gpu = [], 0, 0
    for role, pool in (("prefill", dis.prefill), ("decode", dis.decode)):
        key = f"disaggregation.{role}"
        scn = scenario.model_copy(update={"parallel": scenario.parallel.model_copy(
            update={"tp": pool.tp, "replicas": pool.replicas})})
        try:
            check_parallel(scn)
        except ConfigError as exc:
            raise ConfigError(exc.message, path=f"{key}.tp") from None
        cost = build_cost(scn)
        try:
            kv_blocks, memory = kv_capacity(scn, cost, (f"{key}.tp",))
        except DoesNotFit as exc:
            raise ConfigError(f"the {role} pool has no memory for the KV cache: {exc.message}", path=f"{key}.tp") from None
        plans.append(PoolPlan(role, scn, cost, kv_blocks, memory, replica, gpu))
        replica += pool.replicas
        gpu += pool.replicas * pool.tp
    return plans


def check_fit(plans: list[PoolPlan], longest: int, longest_prompt: int, key: str) -> None:
    """Every request fits every pool it passes through (a prefill pool holds only the prompt): the
    longest request (``longest`` tokens, ``longest_prompt`` of them prompt) must fit a replica's KV
    cache. Raises DoesNotFit naming ``key`` (or a ConfigError at a disaggregated pool's ``tp``).
    Public: the request pipeline's llm deployments check their calls with it too."""
    for plan in plans:
        total = longest_prompt if plan.role == "prefill" else longest
        if plan.role == "both":
            check_requests_fit(plan.scenario, plan.kv_blocks, total, longest_prompt, key, plan.memory)
            continue
        try:
            check_requests_fit(plan.scenario, plan.kv_blocks, total, longest_prompt, key, plan.memory)
        except DoesNotFit as exc:
            raise ConfigError(f"the {plan.role} pool has no memory for the KV cache: {exc.message}",
                              path=f"disaggregation.{plan.role}.tp") from None
