"""The LLM serving path: clients and API servers (frontend), engine replicas with continuous batching
(engine), their traffic on the shared topology (links), their narrow settings, and the assembly
of one run (serving)."""
