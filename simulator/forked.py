"""Work done in a forked child while this process goes on: the second simulation of a run (the
last-mile counterfactual) on another core, and a run's figures drawn while its CSVs are written.

A child is forked only where that is safe and useful: a platform with ``fork``, one thread in this
process (forking a threaded process, as a Jupyter kernel or a Dask worker is, can deadlock the
child), not itself a pool's worker (a sweep's or validation's workers already fill the cores), and
more than one core to run on. Elsewhere :func:`start` returns None and the caller does the work itself.
A child leaves with ``os._exit``, so nothing of the parent's is flushed or run twice.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable


def cores() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def can_fork(parallel: bool = True) -> bool:
    """Whether work may go to a forked child here (``parallel``: whether a second core is what it
    is for; a child that only keeps this process's state apart is fine on one core)."""
    return (hasattr(os, "fork") and threading.active_count() == 1 and multiprocessing.parent_process() is None
            and (not parallel or cores() > 1))


class Child:
    """A forked child running one call; :meth:`join` returns what the call returned, or raises
    :class:`ChildFailed` with what it raised."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd

    def join(self):
        with os.fdopen(self.fd, "rb") as pipe:
            payload = pipe.read()
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        try:
            ok, value = pickle.loads(payload)
        except Exception:  # noqa: BLE001 - the child died before it could say (killed, out of memory)
            raise ChildFailed(f"exit status {status}") from None
        if not ok:
            raise ChildFailed(value)
        return value

    def stop(self) -> None:
        """End the child if it has not been joined (the caller gave up on its work)."""
        if self.pid is None:
            return
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        os.close(self.fd)
        self.pid = None


class ChildFailed(RuntimeError):
    """The call raised in the child (the message is ``Type: text``), or the child died."""


def start(call: Callable, *args, parallel: bool = True) -> Child | None:
    """Run ``call(*args)`` in a forked child (None where :func:`can_fork` says no: the caller runs it).
    What it returns must pickle; what it raises comes back as text."""
    if not can_fork(parallel):
        return None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(read)
            try:
                payload = pickle.dumps((True, call(*args)))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
                payload = pickle.dumps((False, f"{type(exc).__name__}: {exc}"[:4000]))
            with os.fdopen(write, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(0)
    os.close(write)
    return Child(pid, read)
