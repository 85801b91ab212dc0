"""What a closed-form decode run leaves behind (``decode_runs``): its tokens, folded into the token
ledger with the requests' and the scheduler's state after it, and its spans, made from its steps'
times in the order the step-by-step engine records them."""

from __future__ import annotations

import numpy as np


def record_spans(run, k: int, first_step: int, times, counts, tok_spans: list, stream_spans: list) -> None:
    """The run's spans, made from its steps' times, in the order the step-by-step engine records
    them: per step its scheduling, its GPU work, its copy, the arrivals' tokenizations that began
    before its detokenization, the detokenization, the later ones, its stream tasks."""
    o = run.o
    eng, fe = o.e, o.fe
    rec = eng.proc.recorder
    ports, _ = eng.links.d2h_route
    servers, pc = fe.servers, fe.cpu.stream_per_chunk
    g0, g1, d1, e, st0, start, launched, begin, s2, sl, det, out = (times[:, c] for c in range(2, 14))
    _, nd, new, _, sampled, _ = counts.T
    o = s2 + det
    has_sched = sl > 0
    has_d2h = sampled > 0
    has_detok = has_d2h & (det > 0)
    has_out = has_d2h & (out > 0)
    copies = has_d2h & (eng.links.d2h_bytes(sampled) > 0)  # none where the copy is free (the counterfactual)
    gpus, nports = len(eng.gpu_tracks), len(ports)
    tok_before = np.zeros(k, dtype=np.int64)
    tok_after = np.zeros(k, dtype=np.int64)
    if tok_spans:
        tk, after, tj, tst, ten = (np.array(c) for c in zip(*tok_spans))
        np.add.at(tok_before, tk[~after], 1)
        np.add.at(tok_after, tk[after], 1)
    if len(servers) == 1:
        has_stream = has_d2h & (sampled * pc > 0)
        n_stream = has_stream.astype(np.int64)
    else:
        n_stream = np.zeros(k, dtype=np.int64)
        if stream_spans:
            sk, sj, sst, sen = (np.array(c) for c in zip(*stream_spans))
            np.add.at(n_stream, sk, 1)
    per_step = (has_sched + gpus + nports * copies + tok_before + has_detok + has_out + tok_after + n_stream)
    base = rec.count + np.cumsum(per_step) - per_step  # each step's first place in the order
    at_gpu = base + has_sched
    at_tok = at_gpu + gpus + nports * copies         # the first tokenization before the detokenization
    at_detok = at_tok + tok_before
    at_out = at_detok + has_detok
    at_stream = at_out + has_out + tok_after
    proc = eng.proc.track
    # the engine process: scheduling, detokenization and the output objects, in the order recorded
    places = np.concatenate([base[has_sched], at_detok[has_detok], at_out[has_out]])
    order = np.argsort(places, kind="stable")
    names = (["schedule+launch"] * int(has_sched.sum()) + ["detokenize"] * int(has_detok.sum())
             + ["output"] * int(has_out.sum()))
    rec.add_block(proc, list(np.array(names, dtype=object)[order]),
                  np.concatenate([start[has_sched], s2[has_detok], o[has_out]])[order],
                  np.concatenate([launched[has_sched], o[has_detok], e[has_out]])[order], "cpu", places[order])
    labels = [f"step {first_step + i} ({d}d+{p}p)" for i, d, p in zip(range(k), nd.tolist(), new.tolist())]
    cats = np.where(new > 0, "prefill", "decode").tolist()
    for g, track in enumerate(eng.gpu_tracks):
        rec.add_block(track, labels, g0, g1, cats, at_gpu + g)
    for p, port in enumerate(ports):
        rec.add_block(port.track, "d2h", begin[copies], d1[copies], "link", (at_gpu + gpus + p)[copies])
    # the API servers: tokenizations (in the order they were booked) and stream tasks
    tok = None
    if tok_spans:
        tok = (tj, tst, ten, np.where(after, (at_out + has_out)[tk], at_tok[tk]) + _ranks(tk, after))
    if len(servers) == 1:
        streams = {0: (at_stream[has_stream], st0[has_stream], st0[has_stream] + (sampled * pc)[has_stream])}
    else:
        streams = _server_streams(sk, sj, sst, sen, at_stream) if stream_spans else {}
    _server_spans(rec, servers, tok, streams)


def _ranks(tk, after) -> np.ndarray:
    """Each tokenization's rank among its step's, before the detokenization (``after`` False) or after."""
    rank = np.zeros(len(tk), dtype=np.int64)
    for flag in (False, True):
        sel = np.flatnonzero(after == flag)
        if len(sel):
            first = np.r_[True, tk[sel][1:] != tk[sel][:-1]]
            group = np.cumsum(first) - 1
            starts = np.flatnonzero(first)
            rank[sel] = np.arange(len(sel)) - starts[group]
    return rank


def _server_streams(sk, sj, sst, sen, at_stream) -> dict:
    """Per API server with stream tasks: their places (a step's tasks go server by server, each
    after the servers before it), starts and ends."""
    first = np.r_[True, sk[1:] != sk[:-1]]
    before = np.arange(len(sk)) - np.flatnonzero(first)[np.cumsum(first) - 1]
    seq = at_stream[sk] + before
    return {int(j): (seq[sj == j], sst[sj == j], sen[sj == j]) for j in np.unique(sj)}


def _server_spans(rec, servers, tok, streams: dict) -> None:
    """Each API server's tokenizations (``tok``: server, start, end and place of each) and stream
    tasks (``streams``: server -> places, starts, ends), as one block in the recording order; only
    the servers that ran something are visited."""
    busy = set(streams) | (set(np.unique(tok[0]).tolist()) if tok is not None else set())
    for j in sorted(busy):
        seq_parts, name_parts, start_parts, end_parts = [], [], [], []
        if tok is not None:
            tj, tst, ten, tok_seq = tok
            mine = tj == j
            seq_parts.append(tok_seq[mine])
            name_parts.append(np.full(int(mine.sum()), "tokenize", dtype=object))
            start_parts.append(tst[mine])
            end_parts.append(ten[mine])
        if j in streams:
            seq, st, en = streams[j]
            seq_parts.append(seq)
            name_parts.append(np.full(len(seq), "stream", dtype=object))
            start_parts.append(st)
            end_parts.append(en)
        seqs = np.concatenate(seq_parts)
        if not len(seqs):
            continue
        order = np.argsort(seqs, kind="stable")
        rec.add_block(servers[j].track, list(np.concatenate(name_parts)[order]), np.concatenate(start_parts)[order],
                      np.concatenate(end_parts)[order], "cpu", seqs[order])


def record_tokens(run, k: int, first_step: int, times: dict, srv_start) -> None:
    """The run's tokens in the ledger, and the requests', the scheduler's and the engine's state."""
    o = run.o
    eng, fe, t, sched = o.e, o.fe, o.e.table, o.e.sched
    bs = eng.sv.block_size
    rid = np.asarray(run.rid, dtype=np.int64)
    first = np.asarray(run.first, dtype=np.int64)
    last = np.minimum(np.asarray(run.last, dtype=np.int64), k - 1)
    # the tokens, request by request (each's steps in order): where each stands in its step's
    # stream order (the step's requests in running order) gives its receipt
    ks = np.arange(k)
    act = (ks >= first[:, None]) & (ks <= last[:, None])  # request x step: who emits where
    col, step_of = np.nonzero(act)
    pc = fe.cpu.stream_per_chunk
    nserv = len(fe.servers)
    if nserv == 1:
        rank = np.cumsum(act, axis=0)  # each request's place among the step's requests, from 1
        serialized = srv_start[0][step_of] + pc * rank[col, step_of]
    else:
        serialized = np.empty(len(col))
        api = np.asarray(run.api, dtype=np.int64)
        for j in range(nserv):
            pos_j = np.cumsum(act & (api == j)[:, None], axis=0)
            sel = api[col] == j
            serialized[sel] = np.asarray(srv_start[j])[step_of[sel]] + pc * pos_j[col[sel], step_of[sel]]
    ntok = np.ones(len(col), dtype=np.int64)  # every token is sent as it is made
    received = fe.receipt_time(serialized, ntok)
    # per-request state after the run
    emitted = np.maximum(last - first + 1, 0)
    gen0 = np.asarray(run.gen0, dtype=np.int64)
    t.generated[rid] = gen0 + emitted
    t.sent[rid] = t.streamed[rid] = gen0 + emitted
    has = np.flatnonzero(emitted > 0)
    row_end = np.cumsum(emitted[has])
    t.last_R[rid[has]] = received[row_end - 1]
    starts = row_end - emitted[has]
    prefilled = has >= run.prefilling  # its first row here carries its prefill's first token
    firsts = prefilled & (gen0[has] == 0)
    t.first_R[rid[has[firsts]]] = received[starts[firsts]]
    # the ledger folds rows against the requests' first receipts: the rows go after them
    fe.rows.fold_run(first_step, times, rid[has], first[has], last[has], prefilled, run.prefill_rows, received,
                     rid[col], step_of)
    # computed tokens: a decode's start plus its steps, a partial prefill's chunks so far
    s = np.asarray(run.s, dtype=np.int64)
    c0 = np.asarray(run.c0, dtype=np.int64)
    comp = c0 + np.maximum(last + 1 - s, 0)  # nothing added where it decoded no step here
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
