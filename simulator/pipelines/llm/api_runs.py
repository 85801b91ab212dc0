"""Several API servers' side of a closed-form run's steps, where each receives its part of a step's
outputs as a message or detokenizes it (``decode_runs``).

With several API servers, a step's outputs are split by server (request ``rid`` is server
``rid % n``'s): the engine, or the process that detokenizes, sends one message per server that holds
some (``Engine.send_outputs``), and each such server, in server order, receives its part (where
messages cost), detokenizes it and builds its outputs (where it detokenizes:
``Frontend.stream_with_detok``), then streams one chunk per request that streams
(``Frontend.stream``). :class:`ServerOutputs` plays those tasks on each server's clock with
:meth:`~simulator.hardware.cpu.CPUProcess.submit`'s rule (a task queued at the outputs' arrival
starts once the server is free; one that costs nothing is not booked, but for the detokenization),
in the run's time order with the servers' tokenizations, and keeps each (step, server)'s milestones
for its rows: its tokens differ from the other servers' in when they were received, detokenized
and built.
"""

from __future__ import annotations

import numpy as np

from .settings import detokenize_cost, outputs_cost


class ServerOutputs:
    """The API servers' clocks (``clocks``: a run's ``_Clocks``) as a run's steps' outputs reach them."""

    def __init__(self, eng, fe, clocks, in_api: bool):
        self.eng, self.fe, self.clocks, self.in_api = eng, fe, clocks, in_api
        self.n = len(fe.servers)
        self.costs: dict[int, tuple] = {}  # entries -> (receive, detokenize, output) seconds at one server
        self.sent: dict[int, float] = {}  # entries -> the engine's seconds to send them to one server
        # each (step, server) that received outputs, in play order (steps, then servers: sorted keys)
        self.keys: list[int] = []
        self.marks: tuple[list, list, list, list] = ([], [], [], [])  # i, o, e, x of each key

    def message(self, per: list) -> float:
        """The engine's seconds to send a step's outputs, ``per[j]`` entries to server ``j``: one
        message per server that holds some, each priced by ``Engine.outputs_message_cost`` (the one
        rule), summed in server order as it sums them."""
        sent, one = 0, self.sent
        for c in per:
            if c:
                got = one.get(c)
                if got is None:
                    got = one[c] = self.eng.outputs_message_cost({0: c})
                sent += got
        return sent

    def _costs(self, n: int) -> tuple:
        """One server's seconds for ``n`` entries: to receive their message, to detokenize them and to
        build their outputs (the last two where the API servers detokenize)."""
        got = self.costs.get(n)
        if got is None:
            fe, cpu = self.fe, self.fe.cpu
            got = self.costs[n] = (fe.receive_costs({0: n}).get(0, 0.0),
                                   detokenize_cost(cpu, n) if self.in_api else 0.0,
                                   outputs_cost(cpu, n) if self.in_api else 0.0)
        return got

    def play(self, k: int, at: float, per: list, i: float, o: float, e: float, sent: list | None = None) -> float:
        """Step ``k``'s outputs reach the API servers at ``at``: ``per[j]`` requests of server ``j`` emitted a
        token and ``sent[j]`` of them stream a chunk (None: all; made in the engine or a detokenizer at
        ``i``, ``o``, ``e`` where the API servers do not detokenize). Each server that holds some receives
        its part of the message (the ids of all, where it detokenizes; else the streaming ones'
        outputs), detokenizes the ids and builds the streaming ones' outputs (where it detokenizes),
        then streams (``Frontend.stream`` / ``stream_with_detok``; ``per`` empty: nothing emitted).
        Returns server 0's stream start (0 where it streamed nothing); each other server's is appended
        to the clocks' ``starts``."""
        clocks, keys, (mi, mo, me, mx) = self.clocks, self.keys, self.marks
        srv, starts, in_api = clocks.srv, clocks.starts, self.in_api
        sent = per if sent is None else sent
        st0 = 0.0
        for j in range(1, self.n) if not per else ():  # nothing reached them
            starts[j].append(0.0)
        for j, c in enumerate(per):
            c_sent = sent[j] if c else 0
            m = c if in_api else c_sent  # the entries its part of the message carries
            st = 0.0
            if m:
                state = srv[j]
                recv, det, _ = self.costs.get(m) or self._costs(m)
                ij, oj, ej, xj = i, o, e, e
                if recv > 0:  # its part of the outputs' message
                    xj = self._task(j, state, at, recv, "receive outputs")
                    if in_api:
                        ij = xj
                if in_api:  # the ids it received: detokenized (always booked), then the outputs built
                    if recv <= 0:
                        ij = at
                    oj = xj = ej = self._task(j, state, at, det, "detokenize")
                    out = (self.costs.get(c_sent) or self._costs(c_sent))[2] if c_sent else 0.0
                    if out > 0:
                        xj = ej = self._task(j, state, at, out, "output")
                st = clocks.stream_on(j, at, c_sent)
            elif c:  # its requests' tokens are held back (a stream interval): nothing reaches it
                ij, oj, ej, xj = i, o, e, e
            if j:
                starts[j].append(st)
            else:
                st0 = st
            if c:
                keys.append(k * self.n + j)
                mi.append(ij)
                mo.append(oj)
                me.append(ej)
                mx.append(xj)
        return st0

    def _task(self, j: int, state: list, at: float, seconds: float, label: str) -> float:
        """``seconds`` of ``label`` queued on server ``j`` (``state``: its clock and totals) at ``at``;
        returns its end."""
        st = at if at > state[0] else state[0]
        end = state[0] = st + seconds
        state[1] += seconds
        state[2] += 1
        labels = self.clocks.labels[j]
        labels[label] = labels.get(label, 0.0) + seconds
        if seconds > 0:
            state[3] += end - st
            if self.clocks.spans:
                self.clocks.task_spans.append((j, label, st, end))
        return end

    def row_marks(self, step_of, api) -> dict:
        """Each row's milestones (``step_of``: its step in the run, ``api``: its server) from its step's
        outputs at its server."""
        at = np.searchsorted(np.asarray(self.keys, dtype=np.int64), step_of * self.n + api)
        return {m: np.asarray(v, dtype=float)[at] for m, v in zip(("i", "o", "e", "x"), self.marks)}
