"""SimPy pipelines: the LLM serving path, the DiT path and the token-level pipeline."""

from __future__ import annotations


def simulate(scenario):
    """Run a validated scenario with the pipeline its ``kind`` names; returns a Result."""
    if scenario.kind == "llm":
        from .llm_serving import simulate as run
    elif scenario.kind == "dit":
        from .dit import simulate as run
    elif scenario.kind == "token_pipeline":
        from .token_pipeline import simulate as run
    else:  # pragma: no cover - the loader only admits registered kinds
        raise ValueError(f"no pipeline for kind {scenario.kind!r}")
    return run(scenario)
