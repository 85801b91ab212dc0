"""Where a step's outputs are detokenized and how they reach the API servers: one class per
``serving.detokenizer`` placement, named in ``PLACEMENTS``.

- ``engine``: the engine process detokenizes and builds the outputs, then (where the API servers
  are processes of their own) sends them as a message (vLLM V0, 0.6).
- ``separate``: the engine sends the sampled ids to a detokenizer process, which detokenizes and
  sends the text on to the API servers (SGLang's DetokenizerManager).
- ``api_server``: the engine sends the sampled ids; each API server detokenizes its own requests'
  tokens, builds their outputs and streams them (vLLM V1's OutputProcessor, TensorRT-LLM's serve).

Each hands a processed step over with :meth:`hand_over`, a generator the engine runs; it books CPU
work on the processes' clocks and calls the frontend (``engine.sink``) when the API servers have
the outputs. Messages cost ``settings.output_message_cost`` at each end.
"""

from __future__ import annotations

from ...hardware.cpu import book
from .settings import output_message_cost
from .run_support import declare, only

# How closed-form runs of steps cover the serving keys this module owns (run_support).
declare("detokenizer", only("engine"), "a run detokenizes in the engine process only", "placements")


class InEngine:
    """Detokenize in the engine process, then send to the API servers."""

    @staticmethod
    def hand_over(engine, step, emit, send, prefill_flag, done, at: float, wait: bool):
        env = engine.env
        # the ids are in the engine's process once copied: detokenized, then their outputs built there
        made = (step.d1, *engine.output_work(engine.proc, at, engine.tokens_of(step, emit), send))
        sent = engine.send_outputs(engine.proc, made[-1], emit)
        if wait:  # the engine's loop goes on once the outputs are off its hands
            if sent > env.now:
                yield env.timeout(sent - env.now)
            engine.sink.stream(step.index, emit, send, prefill_flag, done, made)
        else:
            engine.later(sent, lambda: engine.sink.stream(step.index, emit, send, prefill_flag, done, made))


class SeparateProcess:
    """Send the sampled ids to the replica's detokenizer process; it detokenizes and sends on."""

    @staticmethod
    def hand_over(engine, step, emit, send, prefill_flag, done, at: float, wait: bool):
        sent = book(engine.proc, at, output_message_cost(engine.sv, len(emit)), "send outputs")
        engine.later(sent, lambda: SeparateProcess._detokenize(engine, step.index, emit, send, prefill_flag, done,
                                                               engine.tokens_of(step, emit)))
        return
        yield  # a generator, like the other placements

    @staticmethod
    def _detokenize(engine, index: int, emit, send, prefill_flag, done, tokens: int) -> None:
        now, proc = engine.env.now, engine.detok_proc
        received = book(proc, now, output_message_cost(engine.sv, len(emit)), "detokenizer receive")
        made = (received, *engine.output_work(proc, now, tokens, send))
        sent = engine.send_outputs(proc, made[-1], emit)
        engine.later(sent, lambda: engine.sink.stream(index, emit, send, prefill_flag, done, made))


class InApiServers:
    """Send the sampled ids to the API servers, which detokenize, build the outputs and stream."""

    @staticmethod
    def hand_over(engine, step, emit, send, prefill_flag, done, at: float, wait: bool):
        sent = engine.send_outputs(engine.proc, at, emit)
        engine.later(sent, lambda: engine.sink.stream_with_detok(step.index, emit, send, prefill_flag, done,
                                                                  engine.env.now, step.emitted))
        return
        yield  # a generator, like the other placements


PLACEMENTS = {"engine": InEngine, "separate": SeparateProcess, "api_server": InApiServers}
"""``serving.detokenizer`` -> how a step's outputs reach the API servers."""
