"""Speculative decoding: a proposer drafts k tokens per decoding request, the target verifies them in one step.

The mechanism, as vLLM V1 runs it (vllm-project/vllm: vllm/v1/core/sched/scheduler.py schedules
``1 + len(spec_token_ids)`` tokens per running request; vllm/v1/sample/rejection_sampler.py accepts
the longest prefix of the draft the target agrees with and samples one more token, the bonus or
the correction; vllm/v1/spec_decode/eagle.py and llm_base_proposer.py ``propose`` run the drafter
once over the tokens the target just computed, then ``num_speculative_tokens - 1`` single-token
passes, so a step's drafts are ready for the next one):

- **Verify.** Each decoding request feeds its last token and its k drafts: k + 1 query tokens
  attending to its context, priced by the cost model's decode path with ``decode_queries = k + 1``
  (the decode attention kernel reads each request's K/V once for its k + 1 queries; every token
  goes through the GEMMs; logits for all k + 1 positions).
- **Accept.** Draft position i is accepted with probability ``alpha[i]`` given that the ones before
  it were (Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", ICML 2023,
  Sec. 3: with a constant rate alpha the expected tokens per step are (1 - alpha^(k+1)) / (1 - alpha),
  their Eq. 1). The request emits its accepted drafts plus the bonus token, never beyond its output
  length; the rejected drafts' GPU work was paid, and their KV slots are released.
- **Propose.** Per method (``SPEC_METHODS``): a draft model's k forward passes (its own cost model
  on the same GPUs, ``draft_tp`` of them), an EAGLE head's k passes of one target-shaped decoder
  layer plus the LM head, or an n-gram prompt lookup on the engine's CPU.

Draws come from a generator the engine owns, seeded from the scenario's seed and the replica's
index, so a run is deterministic and the workload's own draws are untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...workloads.llm import LLMCostModel, LLMShape
from .run_support import declare, only

# How closed-form runs of steps cover the serving keys this module owns (run_support).
declare("speculative", only(None), "a run verifies no drafts", "speculative")


def alpha_for(tau: float, k: int) -> float:
    """The constant per-position acceptance rate alpha whose expected tokens per step with k drafts,
    (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, Eq. 1), equal ``tau`` (bisection)."""
    if not 1.0 <= tau <= k + 1:
        raise ValueError(f"tau={tau} is outside [1, {k + 1}] for k={k}")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(k + 1)) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def expected_tokens(alpha: np.ndarray) -> float:
    """Expected tokens a step emits (accepted drafts plus the bonus) under per-position rates ``alpha``."""
    return float(1.0 + np.cumprod(alpha).sum())


@dataclass(frozen=True)
class DefaultAcceptance:
    """A method's published mean accepted tokens per step ``tau`` at ``k`` drafts, and where it is from."""

    tau: float
    k: int
    source: str

    @property
    def alpha(self) -> float:
        return alpha_for(self.tau, self.k)


class Proposer:
    """What drafting costs per step: GPU seconds on the replica and CPU seconds on the engine process."""

    def gpu_time(self, verify, chunks, sequences: int, k: int) -> float:
        """GPU seconds to draft k tokens for ``sequences`` requests after a step that verified
        ``verify`` (computed tokens before the step, per decoding request) and computed ``chunks``
        ((computed, new) prompt chunks)."""
        return 0.0

    def cpu_time(self, contexts: np.ndarray, k: int) -> float:
        """Engine-process CPU seconds to draft for requests of ``contexts`` tokens."""
        return 0.0

    def memory(self) -> tuple[float, float]:
        """(weight bytes, KV bytes per token) the proposer holds on the busiest GPU of the replica."""
        return 0.0, 0.0


class ModelProposer(Proposer):
    """A drafter with its own transformer (a small LLM, or an EAGLE head): a first pass over the
    tokens the target just computed (k + 1 per verified request, the new chunk of a prompt), then
    k - 1 passes of one token per drafting request (vLLM V1 ``propose``). Each pass costs its cost
    model's step plus its TP all-reduces on an idle link (the step's own traffic stays the target's)."""

    def __init__(self, cost: LLMCostModel, shares_embeddings: bool = False):
        self.cost = cost
        self.shares_embeddings = shares_embeddings  # an EAGLE head uses the target's embedding and LM head

    def memory(self) -> tuple[float, float]:
        """The drafter's weights and its own KV cache per token on each of its GPUs (vLLM sizes the
        KV pool with the drafter loaded and gives the drafter a KV cache of its own layers)."""
        c = self.cost
        weights = c.weight_bytes_per_gpu()
        if self.shares_embeddings:
            weights -= c.shape.vocab * c.shape.hidden / c.tp * c.b
        return weights, c.kv_bytes_per_token_per_gpu()

    def _pass(self, ctx: float, n_decode: int, chunks, sampled: int, queries: int = 1) -> float:
        c = self.cost.step(ctx, n_decode, chunks, sampled, queries)
        tokens = n_decode * queries + sum(n for _, n in chunks)
        return c.compute + (self.cost.comm_time(tokens) if self.cost.tp > 1 else 0.0)

    def gpu_time(self, verify, chunks, sequences: int, k: int) -> float:
        if not sequences and not chunks:
            return 0.0
        n = len(verify)
        ctx = float(np.sum(verify)) + n * (k + 1)  # the verified requests' contexts after the step
        total = self._pass(ctx, n, list(chunks), sequences, k + 1)
        if sequences:
            ctx += sum(p + n_new for p, n_new in chunks)
            for j in range(1, k):
                total += self._pass(ctx + j * sequences, sequences, (), sequences)
        return total


class NgramProposer(Proposer):
    """Prompt lookup (vllm/v1/spec_decode/ngram_proposer.py: per request, a KMP scan of its token
    history for the longest suffix n-gram seen before, proposing the k tokens that followed it).
    No GPU work; CPU per request ``PER_REQUEST`` plus ``PER_TOKEN`` per context token."""

    PER_REQUEST = 1.5e-6
    PER_TOKEN = 2.1e-9
    """Measured on the build host (Intel Xeon, numba 0.68.1): the KMP longest-suffix-match scan
    (min_n 1, max_n 4, k 4) compiled with numba ``@njit`` as vLLM compiles it, over 256 / 1,024 /
    4,096 random int32 tokens: 1.99 / 3.47 / 10.16 us per call (20,000 calls each), i.e. 2.1 ns
    per token plus 1.5 us per call. vLLM runs the calls in a numba ``prange`` over requests; this
    prices them on one thread."""

    def cpu_time(self, contexts: np.ndarray, k: int) -> float:
        return self.PER_REQUEST * len(contexts) + self.PER_TOKEN * float(np.sum(contexts))


def _draft_cost(scenario, target: LLMCostModel) -> LLMCostModel:
    spec = scenario.serving.speculative
    tp = spec.draft_tp or target.tp
    return LLMCostModel(LLMShape.from_spec(spec.draft_model), target.gpu, target.dtype, tp, 1,
                        target.link_bandwidth, target.link_latency, target.allreduce_link if tp == target.tp else None,
                        target.allreduce, target.attention, target.moe)


def _eagle_cost(scenario, target: LLMCostModel) -> LLMCostModel:
    """One decoder layer of the target's shape with the target's LM head (EAGLE, Li et al. ICML
    2024, Sec. 4: the draft head is a single transformer decoder layer over the target's features
    and reuses the target's embedding and LM head; its fusing FC over 2 x hidden is left out)."""
    return LLMCostModel(replace(target.shape, layers=1), target.gpu, target.dtype, target.tp, 1,
                        target.link_bandwidth, target.link_latency, target.allreduce_link, target.allreduce,
                        target.attention, target.moe)


@dataclass(frozen=True)
class SpecMethod:
    """A ``serving.speculative.method``: its sourced default acceptance and how to build its proposer."""

    default: DefaultAcceptance
    build: object  # (scenario, target cost model) -> Proposer


SPEC_METHODS = {
    "draft": SpecMethod(
        DefaultAcceptance(2.28, 5, "Spec-Bench leaderboard (hemingkx/Spec-Bench@fd2c1cd Leaderboard.md, A100): "
                          "SpS (vicuna-68m drafting Vicuna-7B) mean accepted tokens 2.28, with HF transformers "
                          "4.37.1 (Spec-Bench requirements.txt) assisted generation at its default "
                          "num_assistant_tokens 5"),
        lambda scenario, target: ModelProposer(_draft_cost(scenario, target))),
    "eagle": SpecMethod(
        DefaultAcceptance(2.70, 3, "vLLM blog 2026-03-13 P-EAGLE (vllm-project.github.io@c3a01c4 "
                          "_posts/2026-03-13-p-eagle.md), table EAGLE-3 (AL): chain drafting in vLLM, "
                          "num_speculative_tokens 3, MT-Bench, acceptance length 2.70"),
        lambda scenario, target: ModelProposer(_eagle_cost(scenario, target), shares_embeddings=True)),
    "ngram": SpecMethod(
        DefaultAcceptance(1.75, 10, "Spec-Bench leaderboard (hemingkx/Spec-Bench@fd2c1cd Leaderboard.md, A100): "
                          "PLD (prompt lookup) on Vicuna-7B mean accepted tokens 1.75, drafting "
                          "draft_num_candidate_tokens 10 (evaluation/inference_pld.py)"),
        lambda scenario, target: NgramProposer()),
}
"""``serving.speculative.method`` -> its default acceptance and proposer."""


class SpecDecoder:
    """One replica's speculative decoding: k, the per-position acceptance rates, the proposer and
    the generator of acceptance draws; counts what it verified and accepted for the summary."""

    def __init__(self, k: int, alpha: np.ndarray, proposer: Proposer, rng: np.random.Generator):
        self.k = k
        self.alpha = np.asarray(alpha, dtype=float)
        self.proposer = proposer
        self.rng = rng
        self.verified = 0   # request-steps that verified drafts
        self.emitted = 0    # tokens those request-steps emitted (accepted drafts + bonus, capped by the output)
        self.drafted = 0    # draft tokens proposed and verified
        self.accepted = 0   # of which accepted

    @classmethod
    def from_scenario(cls, scenario, target: LLMCostModel, replica: int) -> "SpecDecoder":
        spec = scenario.serving.speculative
        method = SPEC_METHODS[spec.method]
        acc = spec.acceptance
        if acc is None:
            alpha = np.full(spec.tokens, method.default.alpha)
        elif isinstance(acc, list):
            alpha = np.array(acc, dtype=float)
        else:
            alpha = np.full(spec.tokens, float(acc))
        rng = np.random.default_rng([scenario.seed, 0x5BEC, replica])
        return cls(spec.tokens, alpha, method.build(scenario, target), rng)

    def draw(self, n: int) -> np.ndarray:
        """Accepted drafts of ``n`` requests: the length of each one's leading run of accepted positions."""
        if not n:
            return np.zeros(0, dtype=np.int64)
        ok = self.rng.random((n, self.k)) < self.alpha[None, :]
        return np.cumprod(ok, axis=1).sum(axis=1).astype(np.int64)

    def step_time(self, cost: LLMCostModel, comp: np.ndarray, chunks, sequences: int, sampled: int) -> float:
        """GPU seconds of a verify step: the target over each decode's k + 1 tokens and the
        chunks, logits for ``sampled`` positions, then drafting for the ``sequences`` requests that
        sampled a token."""
        k = self.k
        ctx = float(comp.sum()) + len(comp) * (k + 1)
        target = cost.step(ctx, len(comp), list(chunks), sampled, k + 1).compute
        return target + self.proposer.gpu_time(comp, list(chunks), sequences, k)

    def record(self, accepted: np.ndarray, emitted: np.ndarray) -> None:
        self.verified += len(accepted)
        self.drafted += self.k * len(accepted)
        self.accepted += int(accepted.sum())
        self.emitted += int(emitted.sum())


def merged_stats(decoders) -> dict | None:
    """The run's speculative-decoding summary over every replica (None without speculation)."""
    decoders = [d for d in decoders if d is not None]
    if not decoders:
        return None
    verified = sum(d.verified for d in decoders)
    drafted = sum(d.drafted for d in decoders)
    return {"tokens": decoders[0].k,
            "acceptance": [float(a) for a in decoders[0].alpha],
            "expected_tokens_per_step": expected_tokens(decoders[0].alpha),
            "acceptance_length": sum(d.emitted for d in decoders) / verified if verified else None,
            "draft_acceptance_rate": sum(d.accepted for d in decoders) / drafted if drafted else None,
            "verify_steps": verified}
