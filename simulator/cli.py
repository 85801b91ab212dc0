"""The ``lastmile`` command line. Each subcommand lives in its own module under ``simulator.commands``."""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import sys
import time

from . import progress
from .errors import LastmileError

COMMANDS = {
    "run": "simulator.commands.run",
    "measure-cpu": "simulator.commands.measure",
    "measure-gpu": "simulator.commands.measure_gpu",
    "measure-engine": "simulator.commands.measure_engine",
    "validate": "simulator.commands.validate",
    "calibrate": "simulator.commands.calibrate",
    "sweep": "simulator.commands.sweep",
    "plan": "simulator.commands.plan",
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


class _Version(argparse.Action):
    """``--version``, reading the installed version (importlib.metadata, ~15 ms) only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        parser._print_message(f"lastmile {version()}\n", sys.stdout)  # where argparse's version action prints
        parser.exit()


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


def _command_in(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the top level takes no values)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, dict]:
    """The parser, with the modules of the subcommands it needs imported.

    Given ``argv``, only its subcommand's module is imported (a plain run does not load the sweep's,
    the schema's or the calibration's dependencies, and ``--version`` none); every module is imported
    when the top-level ``--help`` lists them all, or when no ``argv`` is given.
    """
    parser = _Parser(prog="lastmile", description="Where does the time go between a request "
                                     "and its answer reaching the user? A discrete-event simulator of inference "
                                     "pipelines: GPU compute versus the last mile.")
    parser.add_argument("--version", action=_Version)
    _verbosity_flags(parser, progress.NORMAL)
    sub = parser.add_subparsers(dest="command", required=True)
    if argv is None:
        wanted = set(COMMANDS)
    else:
        command = _command_in(argv)
        top = argv[: argv.index(command)] if command in argv else argv
        wanted = {command} & set(COMMANDS) or (set(COMMANDS) if {"-h", "--help"} & set(top) else set())
    modules = {}
    for name, path in COMMANDS.items():
        if name not in wanted:
            sub.add_parser(name)  # a valid choice; its help is only shown by the listing that imports it
            continue
        module = importlib.import_module(path)
        modules[name] = module
        p = sub.add_parser(name, help=module.HELP.replace("%", "%%"), description=module.HELP)
        _verbosity_flags(p, argparse.SUPPRESS)
        module.add_arguments(p)
    return parser, modules


def _freeze_at_exit() -> None:
    """Register, once, ``gc.freeze`` to run at the interpreter's exit: the objects left then move to
    the collector's permanent generation, so the shutdown's full collection does not traverse
    everything the run built (about 40 ms of a 0.35 s ``lastmile run``). Nothing is lost: the memory
    goes back with the process, and every file the command wrote was closed when it was written.
    The atexit hook runs only when the process ends, so a caller of :func:`main` in a longer-lived
    process (the tests) keeps its collector as it was until then."""
    global _FREEZE_REGISTERED
    if not _FREEZE_REGISTERED:
        atexit.register(gc.freeze)
        _FREEZE_REGISTERED = True


_FREEZE_REGISTERED = False


def main(argv: list[str] | None = None) -> int:
    _freeze_at_exit()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, modules = build_parser(argv)
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
