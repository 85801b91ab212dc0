"""What a DiT parallel strategy is: a class that adds its share to a stage task and to memory.

A layout composes strategies (``cfg x pipefusion x ulysses x ring x tensor`` or
``distrifusion``); each active one (degree > 1) is asked in turn, in registry order, to add
what it costs to the task being built (:class:`StageWork`) and to the memory of the busiest
GPU (:class:`MemoryShare`). Nothing outside the strategy's own module branches on its name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

from ....hardware import collectives as C
from ....hardware.ops import Op


@dataclass(frozen=True)
class Link:
    """The link the lockstep group's collectives run over: the closed forms of hardware.collectives,
    or, on a catalog node type (``nccl``: GPU count -> the first n GPUs' NCCL group on its topology),
    the plan NCCL's tuning model picks (hardware.nccl) — torch.distributed runs xDiT's collectives
    through NCCL."""

    bandwidth: float
    latency: float
    allreduce_bandwidth: float
    nccl: Callable | None = None

    def _nccl(self, collective: str, nbytes: float, n: int) -> float:
        from ....hardware.nccl import best

        return best(self.nccl(n), collective, nbytes).time

    def allgather_time(self, nbytes: float, n: int) -> float:
        """All-gather to an ``nbytes`` result over ``n`` GPUs."""
        if self.nccl is not None and n > 1:
            return self._nccl("all_gather", nbytes, n)
        return C.allgather_time(nbytes, n, self.bandwidth, self.latency)

    def alltoall_time(self, nbytes: float, n: int) -> float:
        """All-to-all of ``nbytes`` per GPU over ``n`` GPUs."""
        if self.nccl is not None and n > 1:
            return self._nccl("alltoall", nbytes, n)
        return C.alltoall_time(nbytes, n, self.bandwidth, self.latency)

    def ring_pass_time(self, nbytes: float, n: int) -> float:
        """One pass of a ring over ``n`` GPUs: each sends ``nbytes`` to the next, all at once (the
        slowest hop sets it: a hop between nodes where the ring crosses them)."""
        if self.nccl is not None and n > 1:
            return self._nccl("sendrecv", nbytes, n)
        return C.p2p_time(nbytes, self.bandwidth, self.latency)

    def allreduce_time(self, nbytes: float, n: int) -> float:
        """All-reduce of ``nbytes`` on each of ``n`` GPUs."""
        if self.nccl is not None and n > 1:
            return self._nccl("all_reduce", nbytes, n)
        return C.ring_allreduce_time(nbytes, n, self.allreduce_bandwidth, self.latency)


@dataclass(frozen=True)
class StageContext:
    """One stage group's task: its layers, its per-GPU query tokens and what they run on."""

    arch: object            # config.dit_arch.DiTArch
    layers: range           # the stage's layers [l0, l1)
    q: int                  # query tokens per GPU (the task's tokens split over the SP group)
    tokens: int             # image tokens S (every K/V is the full image's)
    batch: int
    act_bytes: int
    layout: object          # pipelines.dit.layout.Layout
    link: Link
    cost: object            # pipelines.dit_cost.DiTCost
    stage_ops: tuple        # the stage's operators before any strategy adds its own
    splits_cross_attention: bool
    sync: bool              # the task waits for its collectives (warmup step, or no staleness)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def kinds(self) -> list[str]:
        """Block kind of each of the stage's layers."""
        return [self.arch.layer_kind(i) for i in self.layers]

    @property
    def last(self) -> bool:
        """Whether the stage holds the model's last layer (and so finishes the step)."""
        return self.layers.stop == self.arch.num_layers


@dataclass
class StageWork:
    """A task being assembled: extra GPU ops, Python dispatch counts, exposed comm, bytes sent."""

    ops: list[Op] = field(default_factory=list)
    cpu_ops: int = 0            # kernel-launching PyTorch ops (eager mode)
    dispatch_only: int = 0      # Python-level calls that launch nothing
    eltwise_passes: int = 0     # extra element-wise passes over the b x q x hidden activation
    comm: float = 0.0           # exposed collective time, seconds
    comm_bytes: float = 0.0     # bytes each GPU sends


@dataclass(frozen=True)
class MemoryContext:
    """What the memory of the busiest GPU depends on."""

    arch: object
    layout: object
    tokens: int
    batch: int
    weight_bytes: int
    act_bytes: int
    layers_max: int         # layers of the largest pipeline stage
    splits_cross_attention: bool


class Strategy:
    """One parallel degree of the layout. Subclasses set ``key`` (the YAML ``parallel.<key>``)."""

    key: ClassVar[str]
    in_group: ClassVar[bool] = True
    """Whether its GPUs run in lockstep inside a stage group (False: CFG branches, PP stages)."""
    caches_cross_kv: ClassVar[bool] = False
    """Whether its attention module caches the text K/V (else diffusers recomputes it per call)."""
    splits_sequence: ClassVar[bool] = False
    """Whether it splits the image tokens ``degree`` ways (sequence and patch parallelism)."""

    def __init__(self, degree: int, parallel):
        self.degree = degree

    @property
    def label(self) -> str:
        """Its part of the layout's label, e.g. ``ulysses4``."""
        return f"{self.key}{self.degree}"

    @property
    def sequence_split(self) -> int:
        """Ways it splits the image tokens over the lockstep group."""
        return self.degree if self.splits_sequence else 1

    @property
    def tensor_split(self) -> int:
        """Ways it splits the weights and heads of every block's operators."""
        return 1

    @property
    def weight_split(self) -> int:
        """Ways the model's weights are divided among GPUs by this strategy."""
        return self.tensor_split

    def add_work(self, ctx: StageContext, work: StageWork) -> None:
        """Add its ops, dispatches and collectives to one stage task (before it is timed)."""

    def add_overlapped(self, ctx: StageContext, work: StageWork, compute: float) -> None:
        """Add collectives that overlap the task's ``compute`` seconds (after it is timed)."""

    def activation_split(self, mem: MemoryContext) -> int:
        """Ways it divides the tokens whose activations peak at once on one GPU."""
        return self.sequence_split

    def extra_weight_bytes(self, mem: MemoryContext) -> float:
        """Weights a GPU holds beyond its ``weight_split`` share."""
        return 0.0

    def state_bytes(self, mem: MemoryContext) -> float:
        """Buffers it keeps for the whole step (stale K/V)."""
        return 0.0

    def in_flight_bytes(self, mem: MemoryContext) -> float:
        """A transient buffer it shares with other strategies (the largest one counts)."""
        return 0.0
