"""SimPy pipelines: the LLM serving path, the DiT path and the token-level pipeline."""
