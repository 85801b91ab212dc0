"""The ``lastmile`` command line. Each subcommand lives in its own module under ``simulator.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from . import progress
from .errors import LastmileError

COMMANDS = {
    "run": "simulator.commands.run",
    "measure-cpu": "simulator.commands.measure",
    "measure-gpu": "simulator.commands.measure_gpu",
    "validate": "simulator.commands.validate",
    "calibrate": "simulator.commands.calibrate",
    "sweep": "simulator.commands.sweep",
    "report": "simulator.commands.report",
    "compare": "simulator.commands.compare",
    "schema": "simulator.commands.schema",
    "catalog": "simulator.commands.catalog",
}


def version() -> str:
    """The installed package's version, or the source tree's when it is not installed."""
    try:
        from importlib.metadata import PackageNotFoundError, version as dist_version

        return dist_version("lastmile-sim")
    except (ImportError, PackageNotFoundError):
        from simulator import __version__

        return __version__


class _Parser(argparse.ArgumentParser):
    """argparse with the project's one-line error (argparse prints the whole usage block first)."""

    def error(self, message: str):
        line = " ".join(message.split())
        self.exit(2, f"lastmile: error: {line[:300]} (see '{self.prog} --help')\n")


def _verbosity_flags(parser: argparse.ArgumentParser, default) -> None:
    """-q / -v, accepted before the subcommand and after it (``lastmile -q validate``, ``lastmile validate -q``)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_const", const=progress.QUIET, dest="verbosity",
                       default=default, help="only errors, warnings and the requested output: no progress, no notes")
    group.add_argument("-v", "--verbose", action="store_const", const=progress.VERBOSE, dest="verbosity",
                       default=default, help="more detail on stderr (timings)")


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = _Parser(prog="lastmile", description="Where does the time go between a request "
                                     "and its answer reaching the user? A discrete-event simulator of inference "
                                     "pipelines: GPU compute versus the last mile.")
    parser.add_argument("--version", action="version", version=f"lastmile {version()}")
    _verbosity_flags(parser, progress.NORMAL)
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, path in COMMANDS.items():
        module = importlib.import_module(path)
        modules[name] = module
        p = sub.add_parser(name, help=module.HELP.replace("%", "%%"), description=module.HELP)
        _verbosity_flags(p, argparse.SUPPRESS)
        module.add_arguments(p)
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    progress.configure(args.verbosity)
    t0 = time.perf_counter()
    try:
        code = modules[args.command].main(args) or 0
        progress.detail(f"{args.command} took {time.perf_counter() - t0:.2f} s")
        return code
    except LastmileError as exc:
        print(f"lastmile: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("lastmile: interrupted", file=sys.stderr)
        return 130
    finally:
        progress.configure(None)


if __name__ == "__main__":
    raise SystemExit(main())
