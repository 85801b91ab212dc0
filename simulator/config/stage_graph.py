"""A request pipeline's graph as names: topological order and the checks a graph must pass.

Pure functions over ``{stage: [stages it waits for]}``, in the config layer so the scenario model
(``pipeline_models``) checks a graph before anything is built and the simulation
(``pipelines.request_graph``) orders its stages with the same code. A cycle is reported by naming
it (``a -> b -> a``).
"""

from __future__ import annotations

from ..errors import ConfigError


def find_cycle(deps: dict[str, list[str]]) -> list[str] | None:
    """One cycle of the graph as a closed walk ``[a, b, ..., a]`` along ``after`` edges; None if acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in deps:
        if state.get(root):
            continue
        stack, path = [(root, iter(deps[root]))], [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(deps.get(nxt, ()))))
                path.append(nxt)
    return None


def topological_order(deps: dict[str, list[str]]) -> list[str]:
    """Stages such that each comes after everything it waits for; ties keep declaration order."""
    order, placed = [], set()
    pending = list(deps)
    while pending:
        ready = [n for n in pending if all(d in placed for d in deps[n])]
        if not ready:
            raise ValueError("the graph has a cycle")
        for n in ready:
            order.append(n)
            placed.add(n)
        pending = [n for n in pending if n not in placed]
    return order


def check_graph(deps: dict[str, list[str]], path: str = "stages") -> None:
    """A graph a request can walk: acyclic (the cycle is named) and with a sink."""
    cycle = find_cycle(deps)
    if cycle is not None:
        # the cycle, written in the direction work flows (each stage before the one that waits for it)
        flow = cycle[::-1]
        raise ConfigError(f"the stages form a cycle: {' -> '.join(flow)}; remove one of these after entries",
                          path=f"{path}.{flow[1]}.after")
    needed = {d for ds in deps.values() for d in ds}
    if all(n in needed for n in deps):
        raise ConfigError("no stage is a sink (every stage is waited for by another)", path=path)
