"""How an MoE layer's routed tokens spread over expert-parallel ranks: expert popularity, the experts'
placement (vLLM's contiguous default, or DeepSeek's EPLB with redundant experts) and the busiest rank.

Expert popularity is Zipf-like with exponent ``skew`` (0: every expert equally popular, the balance
that DeepSeek-V3's auxiliary-loss-free load balancing trains for, arXiv:2412.19437 Sec. 2.1.2). The
step waits for the rank with the most token-expert pairs; with ``n`` pairs routed, rank r expects
``n x share[r]`` of them, and the busiest is taken as the largest mean + sqrt(2 var ln ranks), the
balls-into-bins maximum (Raab & Steger, RANDOM 1998), so equal shares give the uniform case exactly.
"""

from __future__ import annotations

import math

import numpy as np

PLACEMENT_SEED = 0x6E78
"""The fixed shuffle that says which expert ids the popular experts have (popularity is not by id)."""


def expert_loads(experts: int, skew: float) -> np.ndarray:
    """Each expert's share of the routed pairs: Zipf-like, ``1 / rank**skew`` normalised, in id order
    (the popularity ranks shuffled over the ids by a fixed permutation)."""
    ranks = np.arange(1, experts + 1, dtype=float)
    loads = ranks ** -skew
    loads /= loads.sum()
    return loads[np.random.default_rng(PLACEMENT_SEED).permutation(experts)]


def contiguous_shares(loads: np.ndarray, ranks: int) -> np.ndarray:
    """Each rank's share where experts sit in id order, ``experts / ranks`` per rank (vLLM's default
    expert map: rank r holds experts r x local .. (r + 1) x local - 1, ``determine_expert_map``)."""
    return loads.reshape(ranks, -1).sum(axis=1)


def eplb_shares(loads: np.ndarray, ranks: int, redundant: int) -> np.ndarray:
    """Each rank's share after DeepSeek's EPLB (github.com/deepseek-ai/EPLB, global policy): the
    ``redundant`` extra replicas go one at a time to the expert whose load per replica is highest,
    each replica carrying an equal part of its expert's load; then the replicas, heaviest first, go
    to the least loaded rank that has a slot left ((experts + redundant) / ranks slots each)."""
    count = np.ones(loads.size)
    for _ in range(redundant):
        count[int(np.argmax(loads / count))] += 1
    replicas = np.repeat(loads / count, count.astype(int))
    slots = replicas.size // ranks
    share, used = np.zeros(ranks), np.zeros(ranks, dtype=int)
    for load in np.sort(replicas)[::-1]:
        open_ = np.flatnonzero(used < slots)
        r = open_[np.argmin(share[open_])]
        share[r] += load
        used[r] += 1
    return share


def busiest_rank_rows(routed: float, shares: np.ndarray | None, ranks: int, cap: float) -> float:
    """Expected token-expert pairs on the busiest of ``ranks`` ranks when ``routed`` pairs land with
    the ranks' ``shares`` (None: equal), at most ``cap`` (a token sends at most its top-k to one rank)."""
    if shares is None:
        mean = routed / ranks
        return min(float(cap), mean + math.sqrt(2.0 * mean * (1.0 - 1.0 / ranks) * math.log(ranks)))
    means = routed * shares
    spread = np.sqrt(2.0 * means * (1.0 - shares) * math.log(ranks))
    return min(float(cap), float(np.max(means + spread)))
