"""A separate detokenizer process (SGLang's DetokenizerManager) during a closed-form run of steps.

Per step, as :class:`~.placements.SeparateProcess` books it: where some request streams, the engine
builds one entry per streaming request and sends them as a message; the detokenizer receives it,
decodes every token held since its last message, builds the outputs and sends them on to the API
server; a step where nothing streams costs neither process anything and its tokens stay held. The
run plays the detokenizer's clock forward with :meth:`CPUProcess.submit`'s rule and hands its times
and totals back at the run's end (the engine's side goes into the engine's totals and spans).
"""

from __future__ import annotations

import numpy as np

from .settings import detokenize_cost, output_message_cost

HAND = ("entries start", "built", "message start", "handed", "receive start", "entries", "message")
"""A run's hand-over row per step: on the engine's process, when it began building the entries, when
they were built, when their message began and when it was sent; on the detokenizer's, when its
receipt began; the entries' and the message's CPU seconds (0 each where nothing streams). A task that
costs nothing is not booked (``hardware.cpu.book``): it neither waits for the clock nor moves it."""

NO_HAND = (0.0,) * len(HAND)
"""The row of a step that handed nothing over (its outputs carry no token)."""


class DetokClock:
    """The engine's hand-over to its separate detokenizer and that process's clock, step by step:
    :meth:`hand` prices a step tentatively, :meth:`commit` keeps it."""

    def __init__(self, eng):
        self.eng = eng
        self.proc = eng.detok_proc
        self.free = self.proc.free_at
        self.held = eng.held_tokens  # tokens made, not yet sent on (a stream interval above 1)
        self.entry = eng.cpu.stream_entry_per_request
        self.messages: dict[int, float] = {}  # entries -> one end's seconds of their message
        self.decodes: dict[int, float] = {}  # tokens -> their detokenization's seconds
        self.rows: list[tuple] = []  # a ``HAND`` row per committed step
        self._step = None

    def hand(self, at: float, ready: float, chunks: int, tokens: int, out: float, msg: float) -> tuple:
        """A step's outputs (``tokens`` made, ``chunks`` of them streaming) handed over at ``at`` to an
        engine clock free from ``ready``; the outputs' objects cost ``out`` and their message to the API
        server ``msg``. Returns (at the detokenizer, its detokenization's start, its seconds, outputs
        made, sent to the API server, the engine's clock after)."""
        held = self.held + tokens
        if not chunks:  # no entry, no message: the tokens wait where they were made
            self._step = (held, self.free, (at, at, at, at, at, 0.0, 0.0))
            return at, at, 0.0, at, at, ready
        ent = self.entry * chunks
        m = self.messages.get(chunks)
        if m is None:
            m = self.messages[chunks] = output_message_cost(self.eng.sv, chunks)
        hs = built = at
        if ent > 0:
            hs = at if at > ready else ready
            built = ready = hs + ent
        ms = handed = built
        if m > 0:
            ms = built if built > ready else ready
            handed = ready = ms + m
        base = handed if handed > self.free else self.free
        if m > 0:  # received, then detokenized
            i = ds = base + m
        else:  # no receipt booked: the entries are there once sent, detokenized once the clock is free
            i, ds = handed, base
        det = self.decodes.get(held)
        if det is None:
            det = self.decodes[held] = detokenize_cost(self.eng.cpu, held)
        o = ds + det
        e = o + out if out > 0 else o
        sent = e + msg if msg > 0 else e
        self._step = (0, sent, (hs, built, ms, handed, base, ent, m))
        return i, ds, det, e, sent, ready

    def commit(self, handed: bool) -> None:
        """A step is committed: where it ``handed`` outputs over (the one priced last), the detokenizer's
        clock and what it holds move on; a step without outputs has an empty row."""
        if not handed:
            self.rows.append(NO_HAND)
            return
        self.held, self.free, row = self._step
        self.rows.append(row)

    def table(self) -> np.ndarray:
        """The committed steps' ``HAND`` rows, one per row of the run."""
        return np.array(self.rows, dtype=np.float64).reshape(len(self.rows), len(HAND))

    def settle(self, times, counts, hands, chunks_col: int) -> None:
        """Hand the detokenizer's clock and totals back (``times``: the run's step rows, whose
        detokenization, outputs and send columns are the detokenizer's; ``hands``: :meth:`table`),
        and what the engine still holds."""
        chunked = counts[:, chunks_col] > 0
        base, m = hands[:, 4][chunked], hands[:, 6][chunked]
        ds, det, out, e, sent = (times[:, c][chunked] for c in (10, 12, 13, 5, 14))
        ss = times[:, 16][chunked]
        o = ds + det
        got, built, msg = m > 0, out > 0, sent - ss
        sends = msg > 0
        busy = float(m[got].sum()) + float(det.sum()) + float(out[built].sum()) + float(msg[sends].sum())
        tasks = int(got.sum()) + len(det) + int(built.sum()) + int(sends.sum())
        rbusy = (float((ds - base)[got].sum()) + float((o - ds)[det > 0].sum()) + float((e - o)[built].sum())
                 + float(msg[sends].sum()))
        labels = {}
        for label, seconds, booked in (("detokenizer receive", m[got], got.any()), ("detokenize", det, len(det) > 0),
                                       ("output", out[built], built.any()), ("send outputs", msg[sends], sends.any())):
            if booked:
                labels[label] = float(seconds.sum())
        p = self.proc
        p.settle_run(self.free, p.busy + busy, p.tasks + tasks, p.recorded_busy() + rbusy, labels)
        self.eng.settle_held(self.held)

    def engine_totals(self, hands) -> tuple:
        """What the hand-overs add to the engine's process: (busy, tasks, recorded busy, by label)."""
        hs, built, ms, handed, ent, m = (hands[:, c] for c in (0, 1, 2, 3, 5, 6))
        made, sent = ent > 0, m > 0
        labels = {}
        if made.any():
            labels["output"] = float(ent[made].sum())
        if sent.any():
            labels["send outputs"] = float(m[sent].sum())
        return (float(ent[made].sum()) + float(m[sent].sum()), int(made.sum()) + int(sent.sum()),
                float((built - hs)[made].sum()) + float((handed - ms)[sent].sum()), labels)
