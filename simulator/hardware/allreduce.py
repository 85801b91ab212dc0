"""How a serving engine all-reduces its tensor-parallel activations: which algorithm runs at which size.

An engine does not run one all-reduce algorithm: vLLM runs its own NVLink kernels for small
messages and falls back to NCCL above a size cap. Each policy here is a named entry
(``parallel.allreduce`` in a scenario) that, given the message size and the group, picks an
algorithm and returns its idle-fabric closed form as two parts, a fixed cost and the time its
bytes take, so that the SimPy fabric can run the same all-reduce as a transfer that other traffic
slows down (:class:`simulator.pipelines.llm.links.ReplicaLinks`).
"""

from __future__ import annotations

from dataclasses import dataclass


MIB = 1 << 20


@dataclass(frozen=True)
class AllReduceLink:
    """What the closed forms need of a TP group's link: the NCCL path's per-hop latency and bus
    bandwidth, the fixed cost and peer-read rate of a one-shot and of a two-shot kernel
    all-reduce, and whether every GPU reaches every other one over it (NVLink through a switch)."""

    latency: float
    bus_bandwidth: float
    oneshot_latency: float
    oneshot_bandwidth: float
    twoshot_latency: float
    twoshot_bandwidth: float
    fully_connected: bool
    nccl: object = None  # a hardware.nccl.Group where the node type is known: NCCL's own model prices it

    @classmethod
    def without_kernels(cls, latency: float, bandwidth: float, bus_bandwidth: float,
                        fully_connected: bool) -> "AllReduceLink":
        """A link with no measured kernel all-reduce: each kernel costs two hops of its latency
        and reads at its copy rate."""
        return cls(latency, bus_bandwidth, 2 * latency, bandwidth, 2 * latency, bandwidth, fully_connected)


class AllReducePolicy:
    """An engine's all-reduce: :meth:`parts` of one all-reduce of ``nbytes`` over ``n`` GPUs."""

    name = ""

    def parts(self, nbytes: float, n: int, link: AllReduceLink) -> tuple[float, float]:
        """(fixed seconds, seconds its bytes take on an idle fabric)."""
        raise NotImplementedError

    def time(self, nbytes: float, n: int, link: AllReduceLink) -> float:
        """Idle-fabric time of one all-reduce: the sum of its parts."""
        fixed, transfer = self.parts(nbytes, n, link)
        return fixed + transfer


class NCCLAllReduce(AllReducePolicy):
    """Every all-reduce through NCCL at the link's hop latency and bus bandwidth: the bytes of a
    ring, 2(n−1)/n of the buffer, in two hops (reduce-scatter then all-gather with direct peer
    access on a switched fabric; never slower than the ring's 2(n−1) hops). What gpt-fast
    (torch.distributed) and engines without custom kernels run."""

    name = "nccl"

    def parts(self, nbytes: float, n: int, link: AllReduceLink) -> tuple[float, float]:
        if n <= 1:
            return 0.0, 0.0
        if link.nccl is not None:  # a node type's topology: the plan NCCL's tuning model picks
            from .nccl import best

            plan = best(link.nccl, "all_reduce", nbytes)
            return plan.latency, nbytes / plan.algbw
        return 2 * link.latency, 2 * (n - 1) / n * nbytes / link.bus_bandwidth


class VLLMAllReduce(AllReducePolicy):
    """vLLM's choice (``CudaCommunicator.all_reduce``): its custom all-reduce when the TP group
    is 2, 4, 6 or 8 GPUs, fully NVLink-connected (or two GPUs) and the message is below the
    8 MiB buffer (``CustomAllreduce.__init__(max_size=8192 * 1024)``, ``should_custom_ar``);
    inside it, one-shot for two GPUs, below 512 KiB at up to 4 GPUs and below 256 KiB at up
    to 8, two-shot otherwise (``csrc/custom_all_reduce.cuh``, ``REDUCE_CASE``); NCCL above.
    Not modelled: on Hopper with bf16, torch symmetric memory takes TP 6/8 messages above
    256/512 KiB (``all_reduce_utils.py``), at costs within ~20% of the two-shot kernel's
    (vLLM PR #24111's table)."""

    name = "vllm"
    SIZES = (2, 4, 6, 8)
    MAX_SIZE = 8 * MIB

    def parts(self, nbytes: float, n: int, link: AllReduceLink) -> tuple[float, float]:
        if n <= 1:
            return 0.0, 0.0
        custom = n in self.SIZES and (n == 2 or link.fully_connected) and nbytes < self.MAX_SIZE
        if not custom:
            return NCCLAllReduce().parts(nbytes, n, link)
        if n == 2 or (n <= 4 and nbytes < 512 * 1024) or nbytes < 256 * 1024:
            # one-shot: every GPU reads the n−1 peers' whole buffers
            return link.oneshot_latency, (n - 1) * nbytes / link.oneshot_bandwidth
        # two-shot: reduce-scatter and all-gather by peer reads, 2(n−1)/n of the buffer
        return link.twoshot_latency, 2 * (n - 1) / n * nbytes / link.twoshot_bandwidth


ALLREDUCE_POLICIES = {p.name: p for p in (VLLMAllReduce(), NCCLAllReduce())}
"""The engine all-reduce policies a scenario can name (``parallel.allreduce``)."""


def allreduce_link(spec, nccl_group=None) -> AllReduceLink:
    """The closed-form figures of a catalog :class:`~simulator.config.models.LinkSpec`: its
    measured kernel all-reduce where it has one, else two hops of its latency at its copy rate;
    with ``nccl_group`` (the TP group on a node type's topology) NCCL's own model prices NCCL."""
    k = spec.kernel_allreduce
    if k is None:
        link = AllReduceLink.without_kernels(spec.latency, spec.effective_bandwidth, spec.allreduce_bandwidth,
                                             spec.fully_connected)
    else:
        link = AllReduceLink(spec.latency, spec.allreduce_bandwidth, k.oneshot_latency, k.oneshot_bandwidth,
                             k.twoshot_latency, k.twoshot_bandwidth, spec.fully_connected)
    if nccl_group is None:
        return link
    from dataclasses import replace

    return replace(link, nccl=nccl_group)
