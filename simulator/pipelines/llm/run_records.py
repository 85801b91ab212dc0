"""What a closed-form decode run leaves behind (``decode_runs``): its tokens, folded into the token
ledger with the requests' and the scheduler's state after it, and its spans, made from its steps'
times, each track's in time order."""

from __future__ import annotations

import numpy as np

from ...observe.records import BUFFERED, SENT


def record_spans(run, k: int, first_step: int, times, counts, hands=None) -> None:
    """The run's spans, made from its steps' times: on each track, in time order (a process's tasks,
    a GPU's steps and a port's copies do not overlap, so that is the order each was recorded in
    stepped; the recorder orders tracks against one another by time). ``hands``: with a separate
    detokenizer, the engine's hand-overs (``detok_runs.HAND``)."""
    o = run.o
    eng, fe = o.e, o.fe
    rec = eng.proc.recorder
    ports, _ = eng.links.d2h_route
    g0, g1, d1, e, st0, start, launched, begin, s2, sl, det, out = (times[:, c] for c in range(2, 14))
    sent, ss = times[:, 14], times[:, 16]
    _, nd, new, _, sampled, _, emitted, chunks = counts.T
    emits = emitted > 0
    spans: dict = {}  # track -> [(name, start, end)] (a process's tasks; GPU and port spans are recorded apart)

    def add(track, name, starts, ends, where=None) -> None:
        if where is not None:
            starts, ends = starts[where], ends[where]
        spans.setdefault(track, []).append((name, np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)))

    proc = eng.proc.track
    add(proc, "schedule+launch", start, launched, sl > 0)
    # who detokenizes and builds the outputs (and sends them on, where they cross as a message)
    detok_track = fe.servers[0].track if run.in_api else eng.detok_proc.track if run.sep else proc
    if run.sep:  # the engine's entries and their message; the detokenizer receives them, and sends on
        hs, built, ms, handed, base, ent, m = hands.T
        add(proc, "output", hs, built, ent > 0)
        add(proc, "send outputs", ms, handed, m > 0)
        add(detok_track, "detokenizer receive", base, base + m, (chunks > 0) & (m > 0))
        add(detok_track, "send outputs", ss, sent, (chunks > 0) & (sent > ss))
    elif run.ipc:
        add(proc, "send outputs", ss, sent, emits & (sent > ss))
    if not (run.in_api and run.outs is not None):  # (several API servers' own tasks are listed below)
        add(detok_track, "detokenize", s2, s2 + det, emits & (det > 0))
        add(detok_track, "output", s2 + det, e, emits & (out > 0))
    if run.ipc:
        add(proc, "receive request", *_pairs(run.intake.recv_spans))
    clocks, pc = run.clocks, fe.cpu.stream_per_chunk
    if len(fe.servers) == 1:
        add(fe.servers[0].track, "stream", st0, st0 + chunks * pc, (chunks > 0) & (chunks * pc > 0))
    for j, st, en in clocks.stream_spans:
        add(fe.servers[j].track, "stream", [st], [en])
    for j, name, st, en in clocks.task_spans:
        add(fe.servers[j].track, name, [st], [en])
    for j, st, en in run.intake.tok_spans:
        add(fe.servers[j].track, "tokenize", [st], [en])
    add(fe.servers[0].track, "receive outputs", *_pairs(clocks.recv_spans))
    for track, parts in spans.items():
        names = np.concatenate([np.full(len(st), name, dtype=object) for name, st, _ in parts])
        starts = np.concatenate([st for _, st, _ in parts])
        ends = np.concatenate([en for _, _, en in parts])
        order = np.argsort(starts, kind="stable")
        rec.add_block(track, list(names[order]), starts[order], ends[order], "cpu")
    labels = [f"step {first_step + i} ({d}d+{p}p)" for i, d, p in zip(range(k), nd.tolist(), new.tolist())]
    cats = np.where(new > 0, "prefill", "decode").tolist()
    for track in eng.gpu_tracks:
        rec.add_block(track, labels, g0, g1, cats)
    copies = (sampled > 0) & (eng.links.d2h_bytes(sampled) > 0)  # none where the copy is free (the counterfactual)
    for port in ports:
        rec.add_block(port.track, "d2h", begin[copies], d1[copies], "link")


def _pairs(spans: list) -> tuple:
    """(starts, ends) of a list of (start, end)."""
    if not spans:
        return np.empty(0), np.empty(0)
    st, en = zip(*spans)
    return np.array(st), np.array(en)


def record_tokens(run, k: int, first_step: int, times: dict, srv_start) -> None:
    """The run's tokens in the ledger, and the requests', the scheduler's and the engine's state."""
    t = run.o.e.table
    rid = np.asarray(run.rid, dtype=np.int64)
    first = np.asarray(run.first, dtype=np.int64)
    last = np.minimum(np.asarray(run.last, dtype=np.int64), k - 1)
    # the tokens, request by request (each's steps in order): where each stands in its step's
    # stream order (the step's requests in running order) gives its receipt
    ks = np.arange(k)
    act = (ks >= first[:, None]) & (ks <= last[:, None])  # request x step: who emits where
    col, step_of = np.nonzero(act)
    emitted = np.maximum(last - first + 1, 0)
    gen0 = np.asarray(run.gen0, dtype=np.int64)
    t.generated[rid] = gen0 + emitted
    has = np.flatnonzero(emitted > 0)
    prefilled = has >= run.prefilling  # its first row here carries its prefill's first token
    firsts = prefilled & (gen0[has] == 0)
    if run.every > 1:
        _record_held(run, first_step, times, srv_start, rid, first, last, act, col, step_of, gen0, has, prefilled, firsts)
    else:
        _record_streamed(run, first_step, times, srv_start, rid, first, last, act, col, step_of, gen0, emitted,
                         has, prefilled, firsts)
    _record_state(run, k, rid, gen0)


def _record_streamed(run, first_step, times, srv_start, rid, first, last, act, col, step_of, gen0, emitted, has,
                     prefilled, firsts) -> None:
    """Every token streamed as it is made (a chunk each): its receipt from its place in its step's
    stream, folded into the ledger as a run (``TokenLedger.fold_run``)."""
    fe, t = run.o.fe, run.o.e.table
    serialized = _serialized(run, srv_start, act, col, step_of)
    ntok = np.ones(len(col), dtype=np.int64)  # every token is sent as it is made
    received = fe.receipt_time(serialized, ntok)
    t.sent[rid] = t.streamed[rid] = gen0 + emitted
    row_end = np.cumsum(emitted[has])
    t.last_R[rid[has]] = received[row_end - 1]
    starts = row_end - emitted[has]
    t.first_R[rid[has[firsts]]] = received[starts[firsts]]
    if run.outs is not None:  # several API servers received (and detokenized) their parts apart: each row's own milestones
        fe.rows.add_run(first_step, times, first[has], last[has], prefilled, run.prefill_rows, received, rid[col],
                        step_of, marks=run.outs.row_marks(step_of, np.asarray(run.api, dtype=np.int64)[col]))
        return
    # the ledger folds rows against the requests' first receipts: the rows go after them
    fe.rows.fold_run(first_step, times, rid[has], first[has], last[has], prefilled, run.prefill_rows, received,
                     rid[col], step_of)


def _serialized(run, srv_start, sends, col, step_of):
    """When each chunk (``sends``: request x step, who streams where; ``col``, ``step_of``: the chunks'
    requests and steps) was serialized: its API server's stream start that step plus its place among
    that server's chunks of the step."""
    fe = run.o.fe
    pc = fe.cpu.stream_per_chunk
    if len(fe.servers) == 1:
        rank = np.cumsum(sends, axis=0)  # each request's place among the step's chunks, from 1
        return srv_start[0][step_of] + pc * rank[col, step_of]
    serialized = np.empty(len(col))
    api = np.asarray(run.api, dtype=np.int64)
    for j in range(len(fe.servers)):
        pos_j = np.cumsum(sends & (api == j)[:, None], axis=0)
        sel = api[col] == j
        serialized[sel] = np.asarray(srv_start[j])[step_of[sel]] + pc * pos_j[col[sel], step_of[sel]]
    return serialized


def _record_held(run, first_step, times, srv_start, rid, first, last, act, col, step_of, gen0, has, prefilled,
                 firsts) -> None:
    """With a stream interval N above 1: a token streams, with those held since its
    request's last chunk, where ``Engine._emit``'s rule sends (its first token ever, its last, the N-th
    since its last chunk); a held one is "received" when its output is made, as ``Frontend._deliver``
    records it. The rows go to the ledger as any rows (``TokenLedger.add_run``)."""
    fe, t = run.o.fe, run.o.e.table
    N = run.every
    streamed0 = np.asarray(run.streamed0, dtype=np.int64)
    gen = gen0[col] + (step_of - first[col] + 1)  # each row's token: its request's gen-th
    base = np.where(gen0 == 0, 1, streamed0)[col]  # its request's last chunk, or its first token
    send = (gen == 1) | (step_of == np.asarray(run.last, dtype=np.int64)[col]) | ((gen - base) % N == 0)
    sends = np.zeros(act.shape, dtype=bool)
    sends[col, step_of] = send
    sc, sg, ss = col[send], gen[send], step_of[send]
    head = np.ones(len(sc), dtype=bool)  # each request's first chunk of the run
    head[1:] = sc[1:] != sc[:-1]
    before = np.empty(len(sc), dtype=np.int64)
    before[1:] = sg[:-1]
    before[head] = streamed0[sc[head]]
    ntok = sg - before
    received = fe.receipt_time(_serialized(run, srv_start, sends, sc, ss), ntok)
    # several API servers: each row's milestones its server's (``api_runs``); else its step's
    marks = run.outs.row_marks(step_of, np.asarray(run.api, dtype=np.int64)[col]) if run.outs is not None else {}
    R = (marks["e"] if marks else times["e"][step_of]).astype(float)
    R[send] = received
    x = (marks["x"] if marks else times["x"][step_of]).astype(float)
    x[~send] = R[~send]
    tokens = np.zeros(len(col), dtype=np.int64)
    tokens[send] = ntok
    kind = np.where(send, SENT, BUFFERED).astype(np.int8)
    streamed = streamed0.copy()
    np.maximum.at(streamed, sc, sg)
    t.sent[rid] = t.streamed[rid] = streamed
    tail = np.ones(len(sc), dtype=bool)
    tail[:-1] = head[1:]
    t.last_R[rid[sc[tail]]] = received[tail]
    first_of = {slot: r for slot, r in zip(sc[head].tolist(), received[head].tolist())}
    for slot in has[firsts].tolist():  # a first token ever streams at once
        t.first_R[rid[slot]] = first_of[slot]
    fe.rows.add_run(first_step, times, first[has], last[has], prefilled, run.prefill_rows, R, rid[col], step_of,
                    kind=kind, tokens=tokens, marks={**marks, "x": x})


def _record_state(run, k: int, rid, gen0) -> None:
    """The requests', the scheduler's and the engine's state after the run."""
    o = run.o
    eng, fe, t, sched = o.e, o.fe, o.e.table, o.e.sched
    bs = eng.sv.block_size
    # computed tokens: a decode's start plus its steps, a partial prefill's chunks so far
    s = np.asarray(run.s, dtype=np.int64)
    c0 = np.asarray(run.c0, dtype=np.int64)
    comp = c0 + np.maximum(run.computed_through(k) + 1 - s, 0)  # nothing added where it decoded no step here
    if run.partial >= 0:
        comp[run.partial] = run.p_comp
    t.computed[rid] = comp
    admitted = rid[run.admitted:]  # each admitted to catch up to its prompt and what it had generated
    t.target[admitted] = t.prompt[admitted] + gen0[run.admitted:]
    fin = np.asarray(run.finished, dtype=np.int64)
    blocks = -(-comp // bs)
    if len(fin):
        blocks[fin] = 0
    sched.pool.settle(rid, blocks)
    live = np.ones(len(rid), dtype=bool)
    if len(fin):
        live[fin] = False
        finished = rid[fin]
        t.finished[finished] = True
        eng.finished_run(len(finished))
    sched.set_running(rid[live].tolist())
    for r, receipt in zip(rid[fin].tolist(), t.last_R[rid[fin]].tolist()):
        fe.on_finish(r, receipt)
