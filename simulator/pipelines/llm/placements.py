"""Where a step's outputs are detokenized and how they reach the API servers: one class per
``serving.detokenizer`` placement, named in ``PLACEMENTS``.

- ``engine``: the engine process detokenizes and builds the outputs, then (where the API servers
  are processes of their own) sends them as a message (vLLM V0, 0.6).
- ``separate``: the engine sends the streaming requests' new ids to a detokenizer process, which
  detokenizes and sends the text on to the API servers (SGLang's DetokenizerManager).
- ``api_server``: the engine sends the sampled ids; each API server detokenizes its own requests'
  tokens, builds their outputs and streams them (vLLM V1's OutputProcessor, TensorRT-LLM's serve).

Each hands a processed step over with :meth:`hand_over`, a generator the engine runs; it books CPU
work on the processes' clocks and calls the frontend (``engine.sink``) when the API servers have
the outputs. Messages cost ``settings.output_message_cost`` at each end.
"""

from __future__ import annotations

from ...hardware.cpu import book
from .settings import output_message_cost
from .run_support import declare

# How closed-form runs of steps cover the serving keys this module owns (run_support).
declare("detokenizer", owner="placements")  # a separate process only with the layout run_support.ENGINE_CONDITIONS names


def streaming(emit, send):
    """The entries of ``emit`` (a step's emitting requests, or a column aligned with them) that stream
    a chunk this step (``send``: their mask, None for all): what a message to the API servers carries."""
    return emit if send is None else emit[send]


class InEngine:
    """Detokenize in the engine process, then send to the API servers."""

    @staticmethod
    def hand_over(engine, step, emit, send, prefill_flag, done, at: float, wait: bool):
        env = engine.env
        # the ids are in the engine's process once copied: detokenized, then their outputs built there
        made = (step.d1, *engine.output_work(engine.proc, at, engine.tokens_of(step, emit), send))
        sent = engine.send_outputs(engine.proc, made[-1], streaming(emit, send))
        if wait:  # the engine's loop goes on once the outputs are off its hands
            if sent > env.now:
                yield env.timeout(sent - env.now)
            engine.sink.stream(step.index, emit, send, prefill_flag, done, made, step.gen)
        else:  # (pending until then: a closed-form run that starts before delivers them first)
            engine.deliver(sent, lambda now: engine.sink.stream(step.index, emit, send, prefill_flag, done, made,
                                                                 step.gen, now))

    @staticmethod
    def in_order(engine, action, rids) -> None:
        """Record rows made apart from the outputs (a prefill chunk's, of ``rids``): at once."""
        action()


class SeparateProcess:
    """Send the streaming requests' entries to the replica's detokenizer process; it detokenizes
    and sends on.

    As SGLang's ``Scheduler.stream_output_generation`` does: the engine builds an entry only for a
    request that streams this step (every ``stream_interval`` tokens, its first and its last) and
    sends a message only when some does; the detokenizer decodes the tokens the entries carry
    (python/sglang/srt/managers/scheduler_output_processor_mixin.py, detokenizer_manager.py). A
    step with nothing to stream costs neither process anything, and its tokens wait as buffered.
    """

    @staticmethod
    def hand_over(engine, step, emit, send, prefill_flag, done, at: float, wait: bool):
        chunks = len(emit) if send is None else int(send.sum())
        tokens = engine.hold_tokens(engine.tokens_of(step, emit), chunks > 0)
        if not chunks:  # nothing streams: no entry, no message; the tokens are held where they were made
            engine.after_pending(lambda: engine.sink.stream(step.index, emit, send, prefill_flag, done, (at, at, at),
                                                            step.gen, at))
            return
        built = book(engine.proc, at, engine.cpu.stream_entry_per_request * chunks, "output")
        sent = book(engine.proc, built, output_message_cost(engine.sv, chunks), "send outputs")
        engine.deliver(sent, _Handoff(engine, step, emit, send, prefill_flag, done, chunks, tokens),
                       engine.handoffs_pending)
        return
        yield  # a generator, like the other placements

    @staticmethod
    def in_order(engine, action, rids) -> None:
        """Record rows made apart from the outputs (a prefill chunk's, of ``rids``) after the outputs on their way:
        they may be a later step's of a request whose earlier step's outputs are still at the
        detokenizer, and a request's rows reach the ledger in step order."""
        engine.after_pending(action)


class _Handoff:
    """A step's entries on their way to the separate detokenizer; ``after``: what to do once the
    outputs they become reach the API servers (rows of later steps, :meth:`Engine.after_pending`)."""

    def __init__(self, engine, step, emit, send, prefill_flag, done, chunks: int, tokens: int):
        self.args = (engine, step, emit, send, prefill_flag, done)
        self.chunks, self.tokens = chunks, tokens
        self.after: list = []

    def __call__(self, now: float) -> None:
        """The entries reach the detokenizer at ``now``: it receives them, decodes every token held
        since its last message (each is decoded once, with the first chunk that goes after it),
        builds the outputs and sends them on."""
        engine, step, emit, send, prefill_flag, done = self.args
        proc = engine.detok_proc
        received = book(proc, now, output_message_cost(engine.sv, self.chunks), "detokenizer receive")
        made = (received, *engine.output_work(proc, now, self.tokens, send))
        sent = engine.send_outputs(proc, made[-1], streaming(emit, send))
        after = self.after

        def reach(at: float) -> None:
            engine.sink.stream(step.index, emit, send, prefill_flag, done, made, step.gen, at)
            for action in after:
                action()

        engine.deliver(sent, reach)


class InApiServers:
    """Send the sampled ids to the API servers, which detokenize, build the outputs and stream."""

    @staticmethod
    def hand_over(engine, step, emit, send, prefill_flag, done, at: float, wait: bool):
        sent = engine.send_outputs(engine.proc, at, emit)
        engine.deliver(sent, lambda now: engine.sink.stream_with_detok(step.index, emit, send, prefill_flag, done,
                                                                        now, step.emitted, step.gen))
        return
        yield  # a generator, like the other placements

    @staticmethod
    def in_order(engine, action, rids) -> None:
        """Record rows of ``rids`` made apart from the outputs at once, or, where the API servers' loops
        hold their outputs not streamed yet, after those (``Frontend.after_delivered``)."""
        engine.sink.after_delivered(action, rids)


PLACEMENTS = {"engine": InEngine, "separate": SeparateProcess, "api_server": InApiServers}
"""``serving.detokenizer`` -> how a step's outputs reach the API servers."""
