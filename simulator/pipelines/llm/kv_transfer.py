"""Prefill/decode disaggregation: the KV cache of a computed prompt crosses from its prefill
replica to a decode replica, which then generates every output token.

The shape follows the P/D designs that publish it: DistServe (Zhong et al., OSDI'24, §4) and
Splitwise (Patel et al., ISCA'24, §4.2) move the prompt's KV from the prefill instance to the
decode instance over the interconnect, Splitwise and Mooncake (Qin et al., FAST'25, §4) layer by
layer while the prefill runs; vLLM's disaggregated prefill (``NixlConnector``,
docs.vllm.ai ``features/disagg_prefill``) and SGLang's PD mode pull the whole KV once the prefill
is done. The decode instance then computes the prompt's last token itself (vLLM's scheduler
always leaves one token to compute, to produce its logits), so the client's first token comes
from the decode instance's first step: TTFT is prefill + transfer + first decode step, as
users measure it.

The prefill replica keeps the request's KV blocks until the transfer ends; the copy is a flow on
the shared Fabric (``Topology.kv_route``), so transfers contend where they share a NIC or link
and show on its trace track. Per request one flow carries one GPU's shard (the replicas' GPUs
send their shards in parallel on their own links).
"""

from __future__ import annotations

import numpy as np


class KVHandoff:
    """Hands requests whose prompts a prefill replica computed to the decode pool.

    ``bytes_per_token``: KV bytes of one token on one GPU of the narrower pool (the shard one
    link carries); ``layers``: the model's layers (the last layer's KV is sent after the prefill
    even when the rest overlaps it)."""

    def __init__(self, env, topo, decode_engines, router, table, bytes_per_token: float, layers: int,
                 link, layerwise: bool):
        self.env, self.topo, self.decode, self.router, self.table = env, topo, decode_engines, router, table
        self.bytes_per_token = bytes_per_token
        self.layers = layers
        self.link = link
        self.layerwise = layerwise
        table.track_kv_transfers()
        self.bytes_sent = 0.0

    def send(self, src, rids: np.ndarray, step) -> None:
        """Start the transfers of ``rids``, whose prompts ``src`` computed in ``step``."""
        for rid in rids.tolist():
            k = self.router.pick(self.decode, rid)
            self.decode[k].expect(1)  # routed now: the router sees it while its KV is on the way
            self.env.process(self._transfer(src, rid, self.decode[k], step.g1 - step.g0))

    def transfer_bytes(self, rid: int, overlap: float, rate: float) -> float:
        """Bytes still to send when the prefill ends: all of them, or with layer-by-layer sending
        what the route (``rate``: its narrowest port) could not carry while the step's other layers
        were computed (at least the last layer's)."""
        total = self.bytes_per_token * float(self.table.prompt[rid])
        if not self.layerwise:
            return total
        sent = rate * overlap * (self.layers - 1) / self.layers
        return max(total / self.layers, total - sent)

    def _transfer(self, src, rid: int, dst, overlap: float):
        t = self.table
        ports, latency = self.topo.kv_route(src.gpu_index, dst.gpu_index, self.link)
        nbytes = self.transfer_bytes(rid, overlap, min(p.bandwidth for p in ports))
        t.kv_start[rid] = self.env.now
        yield from self.topo.fabric.move(ports, nbytes, latency, f"kv r{rid}")
        self.bytes_sent += nbytes
        t.kv_end[rid] = self.env.now
        src.sched.release(np.array([rid]))
        # the decode replica holds the prompt's KV but for its last token, which it computes
        t.computed[rid] = t.prompt[rid] - 1
        t.target[rid] = t.prompt[rid]
        t.replica[rid] = dst.index
        dst.receive_prefilled(rid)
