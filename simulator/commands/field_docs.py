"""One sentence per scenario key, for ``lastmile schema`` and the generated docs/scenarios.md.

Keys are ``ModelClass.field``; the lookup walks the model's bases, so a key of ``ScenarioBase``
documents it for every kind. A ``Field(description=...)`` in the config models wins over the text
here. A test fails when a scenario key has no description, so a new key cannot go undocumented.
"""

from __future__ import annotations

FIELD_DOCS: dict[str, str] = {
    # ---- every kind ----------------------------------------------------------------------------
    "ScenarioBase.kind": "Which simulator runs the scenario.",
    "ScenarioBase.name": "Names the run and its run folder (runs/<name>-<time>/).",
    "ScenarioBase.description": "Free text saying what the scenario shows.",
    "ScenarioBase.seed": "Random seed; the same scenario and seed give identical results.",
    "ScenarioBase.dtype": "Weight and activation data type; sets bytes per value and the peak FLOP/s used.",
    "ScenarioBase.hardware": "The box: GPU, links, CPU cost profile.",
    "LLMScenario.coalesce_decode": "Compute runs of engine steps in closed form, arrivals and admissions "
                                   "included, where the set-up allows (the same results as stepping them; "
                                   "false steps one by one, for checking).",
    "ScenarioBase.record_spans": "Record every span for trace.json; false saves memory and time on large runs.",
    # ---- hardware ------------------------------------------------------------------------------
    "Hardware.gpu": "A catalog GPU (`lastmile catalog gpus`), a profile YAML, or a mapping "
                    "{base: NAME, <field>: value} overriding some of its fields.",
    "Hardware.gpu_link": "GPU-to-GPU link (`lastmile catalog links`); defaults to the GPU's own; null: no NVLink, "
                         "peer traffic goes over the host link.",
    "Hardware.host_link": "GPU-to-host link (D2H copies, peer traffic without NVLink); defaults to the GPU's own.",
    "Hardware.node_link": "Link between nodes; needed when the GPUs span more than one node.",
    "Hardware.client_link": "Network between the API server and the client.",
    "Hardware.cpu_cores": "Host CPU cores shared by the engine, detokenizer and API-server processes.",
    "Hardware.gpus_per_node": "GPUs in one node; beyond it traffic uses node_link.",
    "Hardware.cpu": "CPU cost profile (`lastmile catalog cpus`), a measured profile YAML, or a mapping.",
    "Hardware.cuda_graphs": "Replay each step as a CUDA graph (one launch); false pays the launch cost per kernel.",
    "GPUSpec.name": "Catalog name of the GPU.",
    "GPUSpec.peak_flops": "Dense peak FLOP/s per dtype (bf16, fp16, fp8, fp32).",
    "GPUSpec.memory": "HBM capacity.",
    "GPUSpec.hbm_bandwidth": "Peak HBM bandwidth.",
    "GPUSpec.sm_count": "Streaming multiprocessors, for GEMM tile/wave quantization.",
    "GPUSpec.achievable": "Fractions of peak that real kernels reach.",
    "Achievable.matmul": "Fraction of peak FLOP/s a large BF16/FP16 GEMM reaches.",
    "Achievable.matmul_fp8": "Fraction of peak FLOP/s a large FP8 GEMM reaches.",
    "Achievable.hbm": "Fraction of peak HBM bandwidth a streaming kernel reaches.",
    "GPUSpec.kernel_overhead": "Idle gap between consecutive kernels replayed from a CUDA graph.",
    "GPUSpec.kernel_floor": "Shortest time a kernel runs, however little work it has (ramp-up, one wave, tail).",
    "GPUSpec.launch_overhead": "CPU-side cost of each eager kernel launch.",
    "GPUSpec.power": "Power for the energy model (observe/energy.py): board limit, idle draw, the server's non-GPU power per GPU.",
    "PowerSpec.max": "Board power limit (TDP): what the GPU draws with its tensor cores or HBM at full rate.",
    "PowerSpec.idle": "Power the GPU draws doing nothing.",
    "PowerSpec.host": "The server's non-GPU power (CPUs, memory, NICs, NVSwitches, fans) per GPU; null: not counted.",
    "GPUSpec.offering": "The prices.yaml offering that prices this GPU by default (cost.offering overrides it).",
    "ScenarioBase.cost": "What the GPUs cost and what the energy counts: the summary's cost and energy blocks.",
    "CostSpec.gpu_hour": "Price per GPU-hour in USD; overrides any offering.",
    "CostSpec.offering": "A prices.yaml offering to price the GPUs by (default: the GPU's own offering).",
    "CostSpec.pue": "The facility's power usage effectiveness: total_joules = (GPUs + hosts) x PUE.",
    "GPUSpec.gemm_mainloop": "GEMM main loop its kernels run: multistage (Ampere/Ada: a wave's loads and "
                             "math partly serialize) or warp_specialized (Hopper+: they overlap but for the "
                             "pipeline fill).",
    "GPUSpec.gpu_link": "The GPU's own GPU-to-GPU link (catalog name), the default of hardware.gpu_link.",
    "GPUSpec.host_link": "The GPU's own host link (catalog name), the default of hardware.host_link.",
    "GPUSpec.sources": "Where each figure comes from (field -> text); not used by the model.",
    "GPUSpec.measured": "How a measured or calibrated profile was made; not used by the model.",
    "LinkSpec.name": "Catalog name of the link.",
    "LinkSpec.bandwidth": "Nominal bandwidth per direction.",
    "LinkSpec.latency": "One-way latency of a transfer.",
    "LinkSpec.achievable": "Fraction of the nominal bandwidth a bulk copy reaches.",
    "LinkSpec.allreduce_busbw": "Measured all-reduce bus bandwidth (NCCL), where known; caps the collective.",
    "LinkSpec.fully_connected": "Every GPU reaches every other directly (NVSwitch), as peer-access "
                                "all-reduce kernels need beyond two GPUs.",
    "LinkSpec.kernel_allreduce": "Measured custom all-reduce kernels on this link (one-shot and two-shot).",
    "KernelAllReduceSpec.oneshot_latency": "Fixed cost of a one-shot all-reduce (launch and two barriers).",
    "KernelAllReduceSpec.oneshot_bandwidth": "Rate at which each GPU reads its n-1 peers' buffers in one-shot.",
    "KernelAllReduceSpec.twoshot_latency": "Fixed cost of a two-shot all-reduce.",
    "KernelAllReduceSpec.twoshot_bandwidth": "Rate at which each GPU reads 2(n-1)/n of the buffer in two-shot.",
    "LinkSpec.sources": "Where each figure comes from; not used by the model.",
    "GPUSpec.arch": "GPU architecture (NVIDIA's name), which selects NCCL's per-architecture constants.",
    "LinkSpec.nccl_bandwidth": "The link's bandwidth per direction in NCCL's topology model, which its collectives reach.",
    "Hardware.node": "Node type (nodes catalog name or mapping): NVLink domain, PCIe switches, sockets, P2P, NICs; "
                     "sets the GPU, node size and links it does not contradict.",
    "NodeSpec.name": "Name of the node type.",
    "NodeSpec.gpu": "The GPU the node holds (gpus catalog).",
    "NodeSpec.gpus": "GPUs per node.",
    "NodeSpec.nvlink": "The GPUs' NVLink (null: PCIe only).",
    "NodeSpec.nvlink_domain": "GPUs that reach one another over NVLink (a node, or a 72-GPU rack).",
    "NodeSpec.nvls": "NVLink SHARP in the switches (NCCL's NVLS all-reduce).",
    "NodeSpec.pcie": "Each GPU's own PCIe link.",
    "NodeSpec.gpus_per_switch": "GPUs under one PCIe switch (0: on CPU root ports).",
    "NodeSpec.switch_uplink": "A PCIe switch's link to its CPU root complex.",
    "NodeSpec.sockets": "CPU sockets.",
    "NodeSpec.socket_link": "The link between CPU sockets.",
    "NodeSpec.p2p": "PCIe peer-to-peer: all, switch (under a common switch only, NCCL's default), none (via host memory).",
    "NodeSpec.nic": "The NIC link.",
    "NodeSpec.nics": "NICs per node.",
    "NodeSpec.shm": ("The rate a copy between GPUs without peer access reaches when staged through host memory "
                     "(NCCL's SHM transport), per sending and per receiving GPU; null: only the route's links limit it."),
    "NodeSpec.sources": "Where each figure comes from; not used by the model.",
    "CPUCosts.name": "Name of the CPU cost profile.",
    "CPUCosts.tokenize_per_token": "API server: tokenizing one prompt token.",
    "CPUCosts.request_overhead": "API server: fixed cost of parsing and admitting one request.",
    "CPUCosts.schedule_per_step": "Engine: fixed cost of one scheduler iteration.",
    "CPUCosts.schedule_per_request": "Engine: scheduling cost per request in the batch.",
    "CPUCosts.prepare_per_step": "Engine: fixed cost of preparing one step's inputs (tensors, H2D copy).",
    "CPUCosts.dispatch_per_step": "Engine: fixed cost per step of starting it on a replica's other GPU workers and collecting them (TP/PP > 1 only).",
    "CPUCosts.prepare_per_request": "Engine: input preparation per request in the batch.",
    "CPUCosts.ipc_per_message": "Serializing and sending (or receiving and deserializing) one message between processes.",
    "CPUCosts.ipc_per_byte": "Per byte of such a message, at each end.",
    "CPUCosts.ipc_bytes_per_request": "Bytes of one request's entry in a step's output message.",
    "CPUCosts.detokenize_per_token": "Incremental detokenization of one token of one request.",
    "CPUCosts.gc_per_request_pair": ("CPython's cyclic garbage collector in the engine's process, per step: this x "
                                     "(requests in the step) squared."),
    "CPUCosts.detokenize_step_fixed": "Fixed detokenizer cost per step.",
    "CPUCosts.output_per_request": "Building one request's output object each step.",
    "CPUCosts.stream_entry_per_request": ("With a separate detokenizer: the engine process adding one streaming request's entry "
                                          "to the step's message (SGLang's Scheduler.stream_output_generation)."),
    "CPUCosts.stream_per_chunk": "Serializing and sending one streamed (SSE) chunk.",
    "CPUCosts.source": "Where the profile comes from; not used by the model.",
    "CPUCosts.sources": "Where each figure comes from; not used by the model.",
    "CPUCosts.measured": "How a measured profile was made; not used by the model.",
    # ---- LLM -----------------------------------------------------------------------------------
    "LLMScenario.model": "A catalog LLM (`lastmile catalog models`) or a mapping {base: NAME, <field>: value}.",
    "LLMSpec.name": "Catalog name of the model.",
    "LLMSpec.layers": "Transformer layers.",
    "LLMSpec.hidden": "Hidden (model) dimension.",
    "LLMSpec.heads": "Attention (query) heads.",
    "LLMSpec.kv_heads": "Key/value heads (GQA); heads must be a multiple of it.",
    "LLMSpec.head_dim": "Dimension of one attention head.",
    "LLMSpec.ffn": "MLP intermediate dimension (per expert for MoE).",
    "LLMSpec.vocab": "Vocabulary size (LM head and embedding).",
    "LLMSpec.context_length": "Longest sequence (prompt + output) the model accepts.",
    "LLMSpec.experts": "MoE experts per layer (1: dense).",
    "LLMSpec.top_k": "Experts each token is routed to.",
    "LLMSpec.shared_ffn": "Intermediate size of the shared experts every token runs besides its routed ones "
                          "(DeepSeek's n_shared_experts x moe_intermediate_size; Qwen MoE's shared expert).",
    "LLMSpec.dense_layers": "Leading layers of an MoE with a dense MLP instead of experts (DeepSeek's first_k_dense_replace).",
    "LLMSpec.dense_ffn": "Intermediate size of the dense layers' MLP.",
    "LLMSpec.sliding_window": "Tokens a sliding-window layer attends to (its last ones).",
    "LLMSpec.sliding_layers": "Layers that attend to the sliding window only (gpt-oss: every other one); their KV "
                              "is held for a window per batch slot, the others' per token.",
    "LLMSpec.mla": "Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): K and V cached as one latent per "
                   "token and layer, on every TP rank.",
    "LLMSpec.weights": "A quantized checkpoint: its weights' format and which weights it covers; unset: the "
                       "scenario's dtype (an FP8 checkpoint runs with dtype: fp8).",
    "LLMSpec.tied_embeddings": "The LM head reuses the embedding matrix (tie_word_embeddings: Gemma, small Llama "
                               "and Qwen models): one vocabulary matrix in memory.",
    "MLASpec.kv_lora_rank": "Width of the cached latent (kv_lora_rank).",
    "MLASpec.rope_head_dim": "Width of the rotary key shared by the heads, cached beside the latent (qk_rope_head_dim).",
    "MLASpec.nope_head_dim": "Width of each head's non-rotary query and key (qk_nope_head_dim).",
    "MLASpec.v_head_dim": "Width of each head's value (v_head_dim).",
    "MLASpec.q_lora_rank": "Width of the query's low-rank bottleneck (q_lora_rank); 0: queries projected directly.",
    "WeightQuant.format": "Checkpoint weight format: mxfp4 (4.25 bits), nvfp4 (4.5), int4 (AWQ/GPTQ, 4 + 20/group), fp8.",
    "WeightQuant.modules": "Which weights the format covers: every linear layer but the LM head, or the routed "
                           "experts alone (gpt-oss).",
    "WeightQuant.group_size": "int4: weights per fp16 scale and 4-bit zero point.",
    "LLMSpec.tokenizer": "Tokenizer family; informational.",
    "LLMSpec.sources": "Where each figure comes from; not used by the model.",
    "LLMScenario.parallel": "Tensor, pipeline and data parallelism.",
    "LLMParallel.expert_parallel": "Shard whole experts across the TP ranks (vLLM's --enable-expert-parallel) "
                                   "instead of each expert's columns: each rank runs its experts for the tokens "
                                   "routed to them, and the step waits for the busiest rank.",
    "LLMParallel.dp_attention": "Run attention data-parallel over the tp ranks (SGLang's --enable-dp-attention, "
                                "vLLM's data parallelism with expert parallelism): each rank holds the attention "
                                "weights whole and its share of the requests and their KV (MLA's latent is cached "
                                "once, not on every rank); the MoE layers' tokens cross by all-to-all. Needs "
                                "expert_parallel.",
    "LLMParallel.expert_skew": "How unevenly tokens pick experts under expert parallelism: expert popularity as "
                               "1/rank**skew (0: equal, the balance DeepSeek-V3's load balancing trains for); the "
                               "step waits for the rank holding the most routed tokens.",
    "LLMParallel.eplb": "Place the experts with DeepSeek's EPLB (vLLM's --enable-eplb): popular experts replicated "
                        "(redundant_experts) and the replicas packed so the ranks' loads even out.",
    "LLMParallel.redundant_experts": "EPLB's extra expert replicas over all ranks; each rank holds (experts + "
                                     "redundant) / tp of them, in memory too.",
    "LLMParallel.tp": "Tensor-parallel degree: GPUs sharing each layer, with all-reduces over the GPU link.",
    "LLMParallel.pp": "Pipeline-parallel degree: stages of consecutive layers.",
    "LLMParallel.allreduce": "How the engine all-reduces TP activations: vllm (custom one-/two-shot NVLink "
                             "kernels below 8 MiB, NCCL above) or nccl (every all-reduce through NCCL).",
    "LLMParallel.replicas": "Independent engine replicas (data parallel) behind the router.",
    "LLMScenario.serving": "Engine settings.",
    "Serving.max_batch": "Most requests in one running batch.",
    "Serving.max_batched_tokens": "Token budget of one step (prefill and decode tokens together).",
    "Serving.chunked_prefill": "Split long prompts over steps to fit the token budget.",
    "Serving.engine": "Engine profile (engines catalog name, profile file or mapping over one): CPU costs and "
                      "serving defaults of a real stack; reference is lastmile's idealised one.",
    "Serving.overlap": "sync: step n+1 is scheduled after step n's CPU work; async_output: after n's sampled "
                       "ids reach the host, n's outputs processed while n+1 runs; async: launched before n ends.",
    "Serving.multi_step": "Decode steps scheduled and prepared once, outputs handled in bulk after the last "
                          "(vLLM 0.6 --num-scheduler-steps); 1: every step.",
    "Serving.api_server_process": "own: API servers are processes of their own (requests and outputs cross as "
                                  "messages); engine: each runs in its replica's engine process, one GIL.",
    "Serving.api_server_loop": "fifo: each API server runs its tasks whole, first come first served; asyncio: an "
                               "event loop in turns (vLLM V1's API server, SGLang's tokenizer manager), outputs "
                               "merging in a chunk while a stream lags; asyncio_per_output: the same loop writing "
                               "one chunk per output (vLLM 0.6.0's streams).",
    "EngineProfile.name": "Name of the engine profile.",
    "EngineProfile.version": "Which release(s) of the engine the profile describes.",
    "EngineProfile.description": "What the profile models.",
    "EngineProfile.cpu": "The cpus catalog entry of the engine's CPU costs.",
    "EngineProfile.costs": "CPU costs laid over that entry.",
    "EngineProfile.serving": "Serving settings the engine defaults to (the scenario's own keys win).",
    "EngineProfile.sources": "Where each figure comes from; not used by the model.",
    "EngineProfile.measured": "How a measured profile was made; not used by the model.",
    "Serving.detokenizer": "Where detokenization runs: in the engine process, a separate process (SGLang), "
                           "or the API servers (vLLM V1).",
    "Serving.api_servers": "API-server processes (tokenize, stream; detokenize with detokenizer api_server).",
    "Serving.stream_interval": "Send every k-th token's text (the first at once).",
    "Serving.block_size": "Tokens per KV-cache block.",
    "Serving.gpu_memory_utilization": "Fraction of GPU memory the engine may use for weights, activations and KV.",
    "Serving.router": ("How requests are spread over replicas: in turn, fewest unfinished requests, fewest KV "
                       "blocks in use, the longest cached prefix while loads are balanced (prefix_affinity: read "
                       "from the replicas' caches; cache_aware: from the router's own tree of the prompts it "
                       "routed, as SGLang's router keeps it), or by session id."),
    "Serving.prefix_cache_insert": ("When a computed prefix block becomes visible to other requests: when its step "
                                    "is scheduled (allocate: vLLM V1 caches blocks on allocation) or once the step's "
                                    "results are processed (after_step: SGLang's radix cache after the forward)."),
    "Serving.kv_offload": ("A host-memory KV tier: evicted prefix blocks and preempted requests' KV are copied "
                           "to CPU memory over the host link and loaded back instead of recomputed."),
    "KVOffload.capacity": "Host memory for KV blocks per replica (bytes, or a string such as 256 GiB).",
    "KVOffload.policy": ("write_through: every cached prefix block is copied out when computed (vLLM's offloading "
                         "connector, LMCache); write_back: only blocks the GPU cache evicts (SGLang HiCache option)."),
    "KVOffload.link": "The link the copies cross (links catalog name or mapping); unset: the GPU's host link.",
    "Serving.prefix_caching": ("Automatic prefix caching (vLLM APC, SGLang RadixAttention): cached prompt-prefix "
                               "blocks are reused, a prefill computes only the uncached suffix, idle cached "
                               "blocks are evicted least recently used. Needs prompts with prefix identity."),
    "Serving.speculative": ("Speculative decoding: each decode step a proposer drafts tokens per request and the "
                            "target verifies them in one step; accepted drafts plus one token are emitted."),
    "Speculative.method": ("draft: a small LLM (draft_model) on the same GPUs; eagle: a one-layer head on the "
                           "target's hidden states; ngram: prompt lookup on the engine's CPU."),
    "Speculative.tokens": "Draft tokens per request per step (k; vLLM's num_speculative_tokens), 1-16.",
    "Speculative.draft_model": "The draft LLM (llms catalog name or mapping); same vocabulary as the target.",
    "Speculative.draft_tp": "GPUs the draft model is split over (vLLM's speculative_draft_tensor_parallel_size); unset: the target's tp.",
    "Speculative.acceptance": ("Probability that each draft position is accepted when the ones before it were: one "
                               "rate, or a list with one per position; unset: the method's published default."),
    "EngineProfile.kernels": "The kernels the engine's step runs: attention, GEMM, all-reduce, sampler, CUDA graphs (the modelled ones set serving/parallel defaults).",
    "EngineKernels.attention": "Attention backend and version for prefill and decode (named, sourced).",
    "EngineKernels.decode_attention": "kernels.yaml decode_attention entry the step's decode attention runs at (sets serving.decode_attention).",
    "EngineKernels.gemm": "GEMM path of the linear layers (named, sourced).",
    "EngineKernels.allreduce": "All-reduce policy of TP activations (sets parallel.allreduce).",
    "EngineKernels.sampler": "Where sampling runs and how the sampled ids reach the host (named, sourced).",
    "EngineKernels.cuda_graphs": "Which steps the engine replays as CUDA graphs (the default of serving.graph_capture, key by key).",
    "Serving.graph_capture": "Which steps replay a CUDA graph (max_tokens, steps, sizes); others launch each kernel (default: the engine profile's kernels.cuda_graphs, else every step).",
    "GraphCapture.max_tokens": "Largest step, in tokens, with a captured graph (none: every size).",
    "GraphCapture.per_sequence": "Captured steps also stop at this many tokens per sequence of serving.max_batch (vLLM V1: 2, V0: 1); none: no such bound.",
    "GraphCapture.steps": "all, or decode_only: steps with prompt chunks run eager.",
    "GraphCapture.sizes": "Only steps of exactly these sizes replay a graph (TensorRT-LLM without padding); none: any size up to max_tokens.",
    "Serving.decode_attention": "Decode attention kernel by KV layout: paged (vLLM, SGLang, TensorRT-LLM) or "
                                "contiguous (a static cache, gpt-fast).",
    "Serving.chunk_bytes_per_token": "Bytes on the wire per streamed token.",
    "Serving.response_header_bytes": "Bytes of each response's headers.",
    "Hardware.step_time": ("A GPU step as a function of its batch (fixed + per_decode x decode requests + "
                           "per_prefill_token x prefill tokens) instead of the roofline: the stub GPU of "
                           "lastmile measure-engine, so both sides see the same GPU. Launch costs are inside it."),
    "StepTime.fixed": "Seconds of every step.",
    "StepTime.per_decode": "Seconds per decoding request in the step.",
    "StepTime.per_prefill_token": "Seconds per prompt token computed in the step.",
    "Serving.last_mile": ("modelled: every cost of the last mile; free: the counterfactual with the last mile "
                          "made free (the D2H copy of sampled ids, detokenization, output objects, the outputs' "
                          "messages between processes, SSE chunks and the client link cost nothing; the "
                          "request's own path in is unchanged). The summary's last_mile_cost is the difference."),
    "LLMScenario.workload": "Who sends what, when.",
    "LLMScenario.disaggregation": ("Prefill/decode disaggregation: prompts on the prefill pool, their KV cache "
                                   "sent over kv_link to a decode replica that generates every token."),
    "Disaggregation.prefill": "The prefill pool.",
    "Disaggregation.decode": "The decode pool.",
    "Disaggregation.kv_link": ("The link the KV cache crosses (links catalog name or mapping: nvlink inside a node, "
                               "ib-400g/roce between nodes); unset: the topology's route between the GPUs."),
    "Disaggregation.transfer": ("whole: the KV is sent after the prefill; layerwise: each layer's KV as it is "
                                "computed, overlapped with the prefill."),
    "Pool.replicas": "Engine replicas in the pool.",
    "Pool.tp": "Tensor parallelism of each replica in the pool.",
    "Workload.requests": "Requests to simulate.",
    "ClientCPU.per_request": "The load generator's CPU to build and send one request (on the host's cores).",
    "ClientCPU.per_chunk": "The load generator's CPU to read one streamed chunk (the chunk is received when read).",
    "Workload.arrival": "Arrival process: open-loop poisson/gamma/constant at rate, all at once, "
                        "closed loop at a concurrency, or a trace's own times.",
    "Workload.rate": "Mean arrival rate (poisson, gamma, constant).",
    "Workload.burstiness": ("Gamma arrivals: coefficient of variation (CV) of the inter-arrival gaps (gamma "
                            "shape 1/CV^2), as Vidur uses it; 1 is Poisson, higher is burstier, lower smoother. "
                            "Every open-loop arrival process starts with its first request at t = 0."),
    "Workload.concurrency": "Closed loop: requests kept in flight. With an open arrival: the most in flight at once (vllm bench serve --max-concurrency): a request due while that many are in flight is sent when one is received.",
    "Workload.trace": ("Trace file, relative to the scenario file: a CSV (columns arrived_at in s, "
                       "num_prefill_tokens, num_decode_tokens) or, by its .jsonl extension, a Mooncake JSON-lines "
                       "trace (timestamp in ms, input_length, output_length, hash_ids of 512-token prompt blocks, "
                       "which give the requests prefix identity)."),
    "Workload.trace_time_scale": "Multiplies the trace's arrival times (below 1 replays it faster).",
    "Workload.trace_repeat": ("More requests than the trace has rows: replay it again and again (request i is row "
                              "i mod rows, with that row's token counts). With arrival `trace`, repetition k's "
                              "times are shifted by k x (the trace's span + its mean inter-arrival gap); with a "
                              "synthetic arrival only the token counts cycle. A .jsonl trace's repetition k has its hash_ids "
                              "shifted by k x (largest id + 1): repeats are new users, sharing no prefix with "
                              "earlier repetitions. Off: too few rows is an error."),
    "Workload.over_context": "A request longer than the model's context_length: error, or truncate its prompt.",
    "Workload.prompt_tokens": "Prompt length: a number or a distribution mapping.",
    "Workload.output_tokens": "Output length: a number or a distribution mapping.",
    "Workload.stages": ("A load profile: stages played back to back, each sending int(rate x duration) requests "
                        "with gaps from `arrival` (poisson, gamma or constant) scaled to fill the stage, as "
                        "inference-perf's constant-rate stages do; later stages start on a loaded server. Sets "
                        "`requests` to the total and replaces `rate`; the summary gains a `stages` block per "
                        "stage, over the requests that arrived in it. At most 100 stages."),
    "Stage.rate": "This stage's arrival rate.",
    "Stage.duration": "How long this stage sends requests (at most a day).",
    "Distribution.dist": "fixed (value), uniform (low..high), lognormal (median, sigma, optional max) or random "
                         "(value, range_ratio: vllm bench serve's random dataset).",
    "Distribution.range_ratio": "random: lengths drawn uniformly in value x (1 -/+ range_ratio), as "
                                "--random-range-ratio (0: every length is value).",
    "Distribution.value": "fixed: the token count; random: the length vllm bench serve is given (--random-input-len or --random-output-len).",
    "Distribution.low": "Uniform: smallest token count.",
    "Distribution.high": "Uniform: largest token count.",
    "Distribution.median": "Lognormal: median token count.",
    "Distribution.sigma": "Lognormal: sigma of the underlying normal.",
    "Distribution.max": "Lognormal: largest token count (samples are clipped).",
    "LLMScenario.slo": "Service-level objectives for goodput.",
    "SLO.ttft": "Time to first token a request must meet (vllm bench serve --goodput ttft).",
    "SLO.tpot": "TPOT (mean time per output token after the first) a request must meet (vllm bench serve --goodput tpot).",
    "SLO.e2el": "End-to-end latency a request must meet (vllm bench serve --goodput e2el); unset: not bounded.",
    "LLMScenario.max_sim_time": "Stop the simulation at this simulated time (null: when all requests finish).",
    # ---- DiT -----------------------------------------------------------------------------------
    "DiTScenario.model": "A catalog DiT (`lastmile catalog dits`) or a mapping {base: NAME, <key>: value}; "
                         "its keys are listed under 'The DiT model mapping'.",
    "DiTScenario.resolution": "Image size: pixels per side, or 'WIDTHxHEIGHT'.",
    "DiTScenario.steps": "Denoising steps.",
    "DiTScenario.cfg": "Classifier-free guidance: two branches per step (batch 2 unless parallel.cfg is 2).",
    "DiTScenario.text_encode": "Run the text encoders before denoising.",
    "DiTScenario.gpus": "GPUs; optional check that the parallel degrees multiply to it.",
    "DiTScenario.parallel": "Parallel degrees in xDiT's terms; their product is the number of GPUs.",
    "DiTParallel.cfg": "CFG parallel: 2 runs the two guidance branches on separate GPUs.",
    "DiTParallel.pipefusion": "PipeFusion (patch-level pipeline) degree.",
    "DiTParallel.ulysses": "Ulysses sequence-parallel degree (all-to-all over heads).",
    "DiTParallel.ring": "Ring-attention sequence-parallel degree.",
    "DiTParallel.tensor": "Tensor-parallel degree.",
    "DiTParallel.distrifusion": "DistriFusion degree (stale activations exchanged by all-gather).",
    "DiTParallel.patches": "PipeFusion patches M (default: the pipefusion degree).",
    "DiTParallel.warmup_steps": "Synchronous (non-stale) steps before PipeFusion/DistriFusion go asynchronous.",
    "DiTParallel.vae_parallel": "Split the VAE decode over all GPUs.",
    "DiTParallel.tensor_cross_attention": "split: tensor parallelism splits the cross-attention too; replicated: "
                                          "every rank runs it whole (xDiT legacy).",
    "DiTScenario.delivery": "What happens after the last denoising step.",
    "Delivery.vae": "Decode the latent to pixels with the VAE.",
    "Delivery.format": "Encoding sent to the client: png/jpeg (images), mp4 (video), raw pixels, or latent (no VAE).",
    "Delivery.compress_level": "PNG zlib level (default: the catalog's, 6).",
    "Delivery.base64": "Base64-encode the image in the response (4/3 the bytes).",
    "Delivery.response_header_bytes": "Bytes of the response's headers.",
    "Delivery.video_codec": "A video's MP4 codec: h264 (libx264) or h265 (libx265), its CPU cost per pixel in the catalog.",
    "DiTScenario.serving": "How the service takes requests: queue policy, batch size, step-level preemption.",
    "DiTServing.policy": "The queue's order: fifo, or shortest_first (least remaining denoising work).",
    "DiTServing.max_batch": "Compatible requests (same shape, same step) one denoising pass holds.",
    "DiTServing.preempt": "Requeue the running pass at a step boundary when a waiting request ranks ahead of it.",
    "DiTScenario.slo": "The latency objective a request must meet for goodput.",
    "DiTSLO.latency": "Seconds from arrival to delivery.",
    "DiTWorkload.trace": "A DiT request trace, relative to the scenario file: a CSV of arrived_at (s), width and height "
                         "(px), and optionally steps and frames (with workload.arrival: trace).",
    "DiTWorkload.shapes": "Request shapes drawn per request by weight (default: every request the scenario's own).",
    "DiTShape.resolution": "The request's image size: pixels per side, or 'WIDTHxHEIGHT'.",
    "DiTShape.steps": "Its denoising steps (default: the scenario's).",
    "DiTShape.frames": "Its video frames (default: the scenario's).",
    "DiTShape.weight": "Its share of the requests, relative to the other shapes' weights.",
    "DiTScenario.kernels": "Attention-kernel efficiency.",
    "Kernels.attention_efficiency": "Fraction of peak FLOP/s the fused attention kernel reaches.",
    "Kernels.head_dim_multiple": "FlashAttention pads the head dimension up to a multiple of this.",
    "DiTScenario.workload": "Requests: the LLM workload's arrival keys (token counts unused), and their shapes.",
    "DiTScenario.max_sim_time": "Stop the simulation at this simulated time (null: when all images finish).",
    # ---- token pipeline -------------------------------------------------------------------------
    "TokenPipelineScenario.model": "A catalog LLM (causal) or DiT (bidirectional), or a mapping with base.",
    "TokenPipelineScenario.sequence_tokens": "Tokens of the one long sequence.",
    "TokenPipelineScenario.parallel": "Pipeline stages.",
    "TokenPipelineParallel.pp": "Pipeline stages (consecutive layers each).",
    "TokenPipelineScenario.slices": "Token slices the sequence is cut into.",
    "TokenPipelineScenario.slicing": "uniform: equal slices; balanced: sized for equal causal-attention cost.",
}

#: The DiT ``model`` mapping is validated by the pydantic ``DiTArch`` (simulator/config/dit_arch.py) after
#: its catalog entry is merged in: its keys, with type, default ('' = required) and meaning.
DIT_MODEL_KEYS: list[tuple[str, str, str, str]] = [
    ("base", "string", "", "Catalog DiT to start from; the other keys override its fields."),
    ("kind", "'dit'", "dit", "Marks a DiT (a token_pipeline model without it is an LLM)."),
    ("name", "string", "the catalog name", "Display name."),
    ("text_mode", "cross | joint | class", "", "How text conditions the image: cross-attention (PixArt), "
     "joint attention (MMDiT: SD3, FLUX) or class labels (DiT)."),
    ("blocks", "int > 0", "", "Transformer blocks (text_mode cross or class, or joint without double_blocks)."),
    ("double_blocks", "int > 0", "", "joint only: double-stream (MMDiT) blocks."),
    ("single_blocks", "int >= 0", "0", "joint only: single-stream blocks after the double ones (FLUX)."),
    ("hidden", "int > 0", "", "Hidden dimension."),
    ("heads", "int > 0", "", "Attention heads."),
    ("head_dim", "int > 0", "", "Dimension of one head."),
    ("mlp_ratio", "number > 0", "", "MLP hidden / hidden."),
    ("patch_size", "int > 0", "", "Latent pixels per patch side."),
    ("patch_frames", "int > 0", "1", "A video DiT's latent frames per patch (Wan, HunyuanVideo: 1)."),
    ("experts", "int > 0", "1", "Denoising experts of one shape, one running per step, all held in memory "
     "(Wan 2.2 A14B: 2, a high-noise and a low-noise expert)."),
    ("eager_code", "diffusers | wan | hunyuanvideo", "diffusers", "The published code whose eager element-wise "
     "passes (FP32 rotary embedding, q/k norms) its blocks run."),
    ("latent_channels", "int > 0", "", "Channels of the latent."),
    ("out_channels", "int > 0", "latent_channels", "Channels the final layer predicts."),
    ("vae_downsample", "int > 0", "8", "Pixels per latent pixel, per side."),
    ("text_tokens", "int >= 0", "0", "Text tokens attended to (> 0 unless text_mode class)."),
    ("params", "number > 0", "", "Parameter count (weights memory)."),
    ("caption_channels", "int >= 0", "0", "Width of the text-encoder output fed to the caption projection."),
    ("context_embedder", "mlp | linear | none", "none for class", "Projection of the text embedding."),
    ("modulation", "single | per_block", "per_block", "adaLN modulation: one shared (PixArt adaLN-single) or "
     "one per block."),
    ("pooled_text_dim", "int >= 0", "0", "Width of the pooled text embedding (SD3, FLUX)."),
    ("guidance_embed", "bool", "false", "Guidance-distilled model with a guidance embedding (FLUX-dev)."),
    ("qk_norm", "bool", "false", "RMSNorm on queries and keys."),
    ("rope", "bool", "false", "Rotary position embedding."),
    ("context_pre_only_last", "bool", "false", "The last joint block updates only the image stream (SD3)."),
    ("num_classes", "int >= 0", "0", "Class labels (text_mode class)."),
    ("text_encoders", "list of mappings", "[]", "Text encoders: name, layers, hidden, heads, head_dim, ffn, "
     "ffn_kind (gated_gelu | gelu), vocab, tokens, params."),
    ("vae", "mapping", "the SD VAE", "VAE decoder: block_out_channels (list), layers_per_block, latent_channels, "
     "out_channels (3), downsample (2^(levels-1)), mid_attention (true), quant_conv, params."),
    ("sources", "mapping", "{}", "Where each figure comes from; not used by the model."),
]
