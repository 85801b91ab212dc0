"""Typed scenario model of a request pipeline (kind ``pipeline``): resources, a graph of stages, a workload.

A request is a directed acyclic graph of **stages**; each stage runs on a named **resource** and
starts when every stage in its ``after`` list is done (or, with ``stream_from``, when a producer
has emitted its first ``outputs`` items). Resources are shared by every request and every stage
that names them, so stages on one resource contend:

- ``cpu``: a pool of ``cores`` identical cores; a stage's ``time`` is its service time on one core,
  queued first come, first served for the core that frees first (M/G/k);
- ``service``: an external service (a web search, a tool API) of unbounded concurrency: a stage's
  ``time`` is its latency and nothing queues;
- ``llm``: a model served by the LLM serving stack (engine, frontend, last mile) of ``kind: llm``,
  built from this resource's ``model``/``hardware``/``serving``/``parallel`` (see
  ``simulator.pipelines.request_graph.llm_stage``);
- ``dit``: a DiT deployment (lastmile's DiT path, its image last mile included) rendering one
  image at a time, built from this resource's ``kind: dit`` keys (``request_graph.dit_stage``).

Bad graphs are one-line ConfigErrors naming the key: a cycle (named stage by stage), a stage
naming a missing resource or dependency (with a did-you-mean suggestion), no sink.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Discriminator, Field, PrivateAttr, Tag, model_validator

from ..errors import ConfigError
from .models import MAX_CONTEXT, Duration, ScenarioBase, Strict, TokenCount, upper_tokens
from .quantities import Count, Horizon, Number, Rate
from .stage_graph import check_graph

MAX_PIPELINE_STAGES = 256
"""Most stages one request graph may hold (an agent loop of 50 turns has ~150)."""

MAX_PIPELINE_REQUESTS = 1_000_000
"""Most pipeline requests one run simulates (each walks the whole graph)."""

MAX_CORES = 1 << 16


def _suggest(word: str, options) -> str:
    close = difflib.get_close_matches(str(word)[:100], [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---- resources -------------------------------------------------------------------------------


class CPUResource(Strict):
    """A pool of identical CPU cores shared by every stage that names it (FCFS for the first free core)."""

    kind: Literal["cpu"] = Field(description="cpu: a pool of cores; service: an external service; llm: a "
                                             "serving deployment.")
    cores: Count(MAX_CORES) = Field(1, description="Cores of the pool; a stage's work takes the first free one "
                                                   "(first come, first served).")


class ServiceResource(Strict):
    """An external service of unbounded concurrency: each call takes its stage's latency."""

    kind: Literal["service"] = Field(description="An external service of unbounded concurrency (a web search, a "
                                                 "tool API): each call takes its stage's time.")


class LLMResource(Strict):
    """One LLM serving deployment (engine replicas, API servers, client link) shared by every stage
    and request that names it. ``model``, ``hardware``, ``serving`` and ``parallel`` are those of a
    ``kind: llm`` scenario (catalog names or mappings); ``hardware`` defaults to the pipeline's."""

    kind: Literal["llm"] = Field(description="An LLM serving deployment shared by the stages naming it.")
    model: Union[str, dict] = Field("llama-3-8b", description="The deployment's model, as a kind: llm scenario's "
                                                              "model (catalog name or mapping).")
    hardware: Optional[Union[str, dict]] = Field(None, description="Its hardware, as a kind: llm scenario's "
                                                                   "(null: the pipeline's hardware).")
    serving: dict = Field({}, description="Its serving section, as a kind: llm scenario's (engine, batching, "
                                          "prefix_caching ...).")
    parallel: dict = Field({}, description="Its parallel section (tp, pp, replicas), as a kind: llm scenario's.")
    _scenario: Any = PrivateAttr(default=None)

    @property
    def scenario(self):
        """The validated ``kind: llm`` scenario this deployment is built from (set by the pipeline)."""
        return self._scenario


class DiTResource(Strict):
    """One DiT deployment (lastmile's DiT path: text encode, denoise on its parallel layout, VAE,
    then the image's last mile: copy to the host, encode, deliver) rendering one image at a time for
    every stage and request that names it. The keys are a ``kind: dit`` scenario's; ``hardware``
    defaults to the pipeline's."""

    kind: Literal["dit"] = Field(description="A DiT deployment shared by the stages naming it.")
    model: Union[str, dict] = Field("pixart-alpha", description="The DiT model, as a kind: dit scenario's "
                                                                "(catalog name or mapping).")
    hardware: Optional[Union[str, dict]] = Field(None, description="Its hardware, as a kind: dit scenario's "
                                                                   "(null: the pipeline's hardware).")
    resolution: Union[int, str] = Field(1024, description="Image size: one side (square) or WIDTHxHEIGHT.")
    steps: Count(10_000) = Field(20, description="Denoising steps per image.")
    cfg: bool = Field(True, description="Classifier-free guidance (two branches per step).")
    text_encode: bool = Field(True, description="Run the text encoder before denoising.")
    parallel: dict = Field({}, description="Its parallel layout, as a kind: dit scenario's (xDiT degrees).")
    delivery: dict = Field({}, description="Its last mile, as a kind: dit scenario's (vae, format, base64 ...).")
    kernels: dict = Field({}, description="Its kernel efficiencies, as a kind: dit scenario's.")
    _scenario: Any = PrivateAttr(default=None)

    @property
    def scenario(self):
        """The validated ``kind: dit`` scenario this deployment is built from (set by the pipeline)."""
        return self._scenario


def _resource_kind(value) -> str:
    return value.get("kind", "") if isinstance(value, dict) else getattr(value, "kind", "")


Resource = Annotated[Union[Annotated[CPUResource, Tag("cpu")], Annotated[ServiceResource, Tag("service")],
                           Annotated[LLMResource, Tag("llm")], Annotated[DiTResource, Tag("dit")]],
                     Discriminator(_resource_kind)]

RESOURCE_KINDS = ("cpu", "service", "llm", "dit")


# ---- stages ----------------------------------------------------------------------------------


class StreamFrom(Strict):
    """Start when ``stage`` (one of ``after``) has emitted its first ``outputs`` items."""

    stage: str = Field(description="The producer: one of this stage's after entries, a cpu or service stage.")
    outputs: Count(1 << 20) = Field(1, description="Start when the producer has emitted this many outputs.")


class StageSpec(Strict):
    """One stage of the request graph. Which keys it takes depends on its resource's kind
    (:data:`STAGE_KEYS`): ``time`` on cpu and service; tokens on llm."""

    resource: str = Field(description="The resource (a key of resources) the stage runs on.")
    after: list[str] = Field([], description="Stages that must end before this one starts.")
    cache_hit_rate: Annotated[Number, Field(ge=0, le=1)] = Field(
        0.0, description="Share of requests whose result of this stage is cached: a hit skips the stage.")
    # cpu / service
    time: Optional[Duration] = Field(None, description="cpu/service: time per request (a quantity, or a "
                                                       "fixed/uniform/exponential/lognormal mapping).")
    outputs: Count(1 << 20) = Field(1, description="cpu/service: outputs the stage emits, evenly over its time "
                                                   "(what a streaming consumer counts).")
    stream_from: Optional[StreamFrom] = Field(None, description="cpu/service: start on a producer's first outputs "
                                                                "instead of its end (the stage still ends after it).")
    # llm: the call's prompt is static_prefix_tokens + prompt_tokens (the part known only when the
    # stage starts: retrieved context, a tool's result)
    prompt_tokens: Optional[TokenCount] = Field(None, description="llm: prompt tokens after the static prefix "
                                                                  "(known when the stage starts).")
    output_tokens: Optional[TokenCount] = Field(None, description="llm: tokens the call generates.")
    static_prefix_tokens: Annotated[int, Field(ge=0, le=MAX_CONTEXT)] = Field(
        0, description="llm: prompt tokens known when the request arrives (system prompt, history), before prompt_tokens.")
    early_start: bool = Field(False, description="llm: prefill the static prefix by a warm-up call at the arrival; "
                                                 "the call then hits it in the prefix cache.")


STAGE_KEYS: dict[str, dict[str, frozenset]] = {
    "cpu": {"needs": frozenset({"time"}), "takes": frozenset({"time", "outputs", "stream_from"})},
    "service": {"needs": frozenset({"time"}), "takes": frozenset({"time", "outputs", "stream_from"})},
    "llm": {"needs": frozenset({"prompt_tokens", "output_tokens"}),
            "takes": frozenset({"prompt_tokens", "output_tokens", "static_prefix_tokens", "early_start"})},
    "dit": {"needs": frozenset(), "takes": frozenset()},  # the image is the resource's: one per call
}
"""Per resource kind: the stage keys it needs and the kind-specific keys it accepts (``resource``,
``after`` and ``cache_hit_rate`` are accepted by every kind)."""

COMMON_KEYS = frozenset({"resource", "after", "cache_hit_rate"})


# ---- workload --------------------------------------------------------------------------------


class PipelineWorkload(Strict):
    """How pipeline requests arrive (``simulator.workloads.arrivals``): an open-loop process at
    ``rate`` (gaps of coefficient of variation ``burstiness`` for gamma), all at once, or a closed
    loop of ``concurrency`` users each sending its next request when its last one completes."""

    requests: Count(MAX_PIPELINE_REQUESTS) = Field(100, description="Pipeline requests to simulate.")
    arrival: Literal["poisson", "gamma", "constant", "all_at_once", "closed"] = Field(
        "poisson", description="Arrival process (simulator.workloads.arrivals); closed: users send again on completion.")
    rate: Optional[Rate] = Field(1.0, description="Open-loop arrival rate.")
    burstiness: Annotated[Number, Field(ge=0.01, le=100)] = Field(
        1.0, description="Gamma arrivals: coefficient of variation of the gaps.")
    concurrency: Optional[Count(1_000_000)] = Field(None, description="Closed loop: users, each with one request "
                                                                      "in flight.")

    @property
    def stages(self):
        """Load profiles are not supported here (``arrivals`` reads this attribute)."""
        return None

    @model_validator(mode="after")
    def _check(self):
        if self.arrival == "closed" and self.concurrency is None:
            raise ConfigError("arrival 'closed' needs workload.concurrency", path="workload.concurrency")
        if self.arrival in ("poisson", "gamma", "constant") and self.rate is None:
            raise ConfigError(f"arrival '{self.arrival}' needs workload.rate", path="workload.rate")
        return self


# ---- the scenario ----------------------------------------------------------------------------


class PipelineScenario(ScenarioBase):
    """Requests that walk a graph of stages on shared resources (``kind: pipeline``).

    ``output`` names the stage whose result reaches the client (its first token is the client's
    TTFT); by default the graph's only sink. E2E ends when every stage of the request is done.
    ``hardware`` is the host of the CPU pools and the default hardware of the llm resources."""

    kind: Literal["pipeline"] = "pipeline"
    name: str = "pipeline"
    resources: Annotated[dict[str, Resource], Field(min_length=1, max_length=64)] = Field(
        description="Shared resources by name: cpu pools, services, llm deployments.")
    stages: Annotated[dict[str, StageSpec], Field(min_length=1, max_length=MAX_PIPELINE_STAGES)] = Field(
        description="The request graph: stage name -> its resource, the stages it waits for and its figures.")
    output: Optional[str] = Field(None, description="The stage whose result reaches the client (its first output "
                                                    "is the TTFT); null: the graph's only sink.")
    workload: PipelineWorkload = Field(PipelineWorkload(), description="How pipeline requests arrive.")
    max_sim_time: Optional[Horizon] = Field(None, description="Stop the simulation at this simulated time (null: "
                                                              "when all requests finish).")

    @model_validator(mode="before")
    @classmethod
    def _no_model(cls, raw):
        """The loader resolves a top-level ``model`` for every kind; a pipeline has none (its models
        live in its llm resources), so an unset one (None) is dropped."""
        if isinstance(raw, dict) and raw.get("model", 0) is None:
            raw = {k: v for k, v in raw.items() if k != "model"}
        return raw

    @model_validator(mode="after")
    def _check_graph(self):
        for name, st in self.stages.items():
            self._check_stage(name, st)
        check_graph({n: list(s.after) for n, s in self.stages.items()}, path="stages")
        if self.output is None:
            sinks = self.sinks
            if len(sinks) > 1:
                raise ConfigError(f"the graph has {len(sinks)} sinks ({', '.join(sinks)}); name the one whose "
                                  "result reaches the client", path="output")
            self.__dict__["output"] = sinks[0]
        elif self.output not in self.stages:
            raise ConfigError(f"no stage {self.output!r}{_suggest(self.output, self.stages)}", path="output")
        self._build_llm_resources()
        self._build_dit_resources()
        return self

    @property
    def sinks(self) -> list[str]:
        """Stages no other stage waits for, in declaration order."""
        needed = {d for s in self.stages.values() for d in s.after}
        return [n for n in self.stages if n not in needed]

    def _check_stage(self, name: str, st: StageSpec) -> None:
        at = f"stages.{name}"
        if st.resource not in self.resources:
            raise ConfigError(f"no resource {st.resource!r}{_suggest(st.resource, self.resources)}; resources: "
                              f"{', '.join(self.resources)}", path=f"{at}.resource")
        for i, dep in enumerate(st.after):
            if dep not in self.stages:
                raise ConfigError(f"no stage {dep!r}{_suggest(dep, self.stages)}", path=f"{at}.after.{i}")
        if len(set(st.after)) != len(st.after):
            raise ConfigError("names a stage twice", path=f"{at}.after")
        kind = self.resources[st.resource].kind
        keys = STAGE_KEYS[kind]
        given = st.model_fields_set - COMMON_KEYS
        extra = sorted(given - keys["takes"])
        if extra:
            raise ConfigError(f"a {kind} stage takes no {extra[0]} (it takes "
                              f"{', '.join(sorted(keys['takes'] | COMMON_KEYS))})", path=f"{at}.{extra[0]}")
        missing = sorted(k for k in keys["needs"] if k not in given or getattr(st, k) is None)  # null is not given
        if missing:
            raise ConfigError(f"a {kind} stage needs {missing[0]}", path=f"{at}.{missing[0]}")
        if st.stream_from is not None:
            self._check_stream(at, st)
        if kind == "llm":
            self._check_llm_stage(at, st)

    def _check_stream(self, at: str, st: StageSpec) -> None:
        src = st.stream_from
        if src.stage not in st.after:
            raise ConfigError(f"{src.stage!r} is not in this stage's after list{_suggest(src.stage, st.after)}",
                              path=f"{at}.stream_from.stage")
        prod = self.stages[src.stage]
        pkind = self.resources[prod.resource].kind
        if pkind not in ("cpu", "service"):
            raise ConfigError(f"{src.stage!r} runs on a {pkind} resource; a stage can stream only from a cpu or "
                              "service stage, whose outputs come evenly over its time", path=f"{at}.stream_from.stage")
        if src.outputs > prod.outputs:
            raise ConfigError(f"{src.stage!r} emits {prod.outputs} outputs, fewer than {src.outputs}",
                              path=f"{at}.stream_from.outputs")

    def _check_llm_stage(self, at: str, st: StageSpec) -> None:
        if st.early_start and not st.static_prefix_tokens:
            raise ConfigError("early_start prefills the static prompt prefix ahead: set static_prefix_tokens",
                              path=f"{at}.early_start")
        res = self.resources[st.resource]
        if st.early_start and not (res.serving or {}).get("prefix_caching", False):
            raise ConfigError(f"early_start reuses the prefix's KV through the engine's prefix cache: set "
                              f"resources.{st.resource}.serving.prefix_caching: true", path=f"{at}.early_start")

    def _build_llm_resources(self) -> None:
        """Validate each llm resource as the ``kind: llm`` scenario it is, sized for its stages' calls."""
        from .loader import load_scenario  # the loader resolves catalogs; imported here to stay below it

        for rname, res in self.resources.items():
            if res.kind != "llm":
                continue
            on = [s for s in self.stages.values() if s.resource == rname]
            prompt = max((s.static_prefix_tokens + upper_tokens(s.prompt_tokens) for s in on), default=1)
            output = max((upper_tokens(s.output_tokens) for s in on), default=1)
            raw = {"kind": "llm", "name": f"{self.name}/{rname}", "seed": self.seed, "dtype": self.dtype,
                   "model": res.model, "serving": dict(res.serving), "parallel": dict(res.parallel),
                   "hardware": res.hardware if res.hardware is not None else self.hardware.model_dump(mode="json"),
                   "record_spans": self.record_spans, "max_sim_time": self.max_sim_time,
                   # closed-form decode runs need the next arrival known ahead (an open loop); a
                   # pipeline's calls arrive when their stages become ready, so steps run one by one
                   "coalesce_decode": False,
                   "workload": {"requests": 1, "arrival": "all_at_once", "prompt_tokens": prompt,
                                "output_tokens": output}}
            serving = res.serving or {}
            if serving.get("prefix_caching") or serving.get("router") == "prefix_affinity":
                # the pipeline gives its calls prefix identity itself (request_graph.llm_stage.call_prefixes);
                # the deployment's scenario says so with a workload.prefix of no shared system prompt
                raw["workload"]["prefix"] = {"shared_tokens": 0, "block_tokens": serving.get("block_size", 16)}
            try:
                sc = load_scenario(raw)
            except ConfigError as exc:
                path = exc.path or ""
                if path.startswith("workload."):  # the longest call of a stage on this resource
                    which = next(n for n, s in self.stages.items() if s.resource == rname)
                    # a stage's calls have no length distribution to cap nor prompts to cut: the one fix is shorter calls
                    raise ConfigError(exc.problem, fix="lower them" if exc.fix else None,
                                      path=f"stages.{which}.{path.removeprefix('workload.')}") from None
                raise exc.moved(path=f"resources.{rname}" + (f".{path}" if path else "")) from None
            res._scenario = sc


    def _build_dit_resources(self) -> None:
        """Validate each dit resource as the ``kind: dit`` scenario it is."""
        from .loader import load_scenario

        for rname, res in self.resources.items():
            if res.kind != "dit":
                continue
            raw = {"kind": "dit", "name": f"{self.name}/{rname}", "seed": self.seed, "dtype": self.dtype,
                   "model": res.model, "resolution": res.resolution, "steps": res.steps, "cfg": res.cfg,
                   "text_encode": res.text_encode, "parallel": dict(res.parallel), "delivery": dict(res.delivery),
                   "kernels": dict(res.kernels), "record_spans": self.record_spans,
                   "max_sim_time": self.max_sim_time,
                   "hardware": res.hardware if res.hardware is not None else self.hardware.model_dump(mode="json")}
            try:
                sc = load_scenario(raw)
            except ConfigError as exc:
                raise exc.moved(path=f"resources.{rname}" + (f".{exc.path}" if exc.path else "")) from None
            res._scenario = sc
