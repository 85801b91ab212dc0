"""Record schemas shared by the pipelines that write records and the metrics that read them, defined once.

The LLM engine writes one row per (request, step) output; what a row is comes from ``ROW_KINDS``.
Every request's latency splits into its kind's categories, which sum to it; the last mile is the
part after the GPU has produced the output.
"""

from __future__ import annotations

# What a row of the LLM per-token record is: a prefill chunk that emitted no token, a token held
# back by the stream interval, or a token the client received in a chunk.
PREFILL_ONLY, BUFFERED, SENT = 0, 1, 2

LLM_CATEGORIES = ("queue", "schedule", "prefill", "kv_transfer", "decode", "comm", "d2h", "detokenize", "output",
                  "ipc", "stream")
# The last mile, by what ran: the sampled ids' copy to the host, detokenization, output processing
# (the per-request output objects: vLLM's RequestOutput, SGLang's BatchStrOut entries), the messages
# carrying ids or outputs between processes (serialize, send, receive, deserialize, and the wait to
# be read), and streaming (the SSE chunk, its write and the network to the client).
LLM_LAST_MILE = ("d2h", "detokenize", "output", "ipc", "stream")

DIT_CATEGORIES = ("queue", "text_encode", "denoise", "comm", "bubble", "vae", "d2h", "ipc", "encode", "deliver")
DIT_LAST_MILE = ("d2h", "ipc", "encode", "deliver")

# What each CPU task label of the LLM serving stack is, as an activity of the breakdown: a step's
# scheduling that waits on its process (a shared GIL) behind these tasks waits on that activity.
# Every other label (scheduling, launches, tokenization, receiving requests) is ``schedule``.
CPU_ACTIVITY = {"detokenize": "detokenize", "output": "output", "stream": "stream", "send outputs": "ipc",
                "receive outputs": "ipc", "detokenizer receive": "ipc"}
