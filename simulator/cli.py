"""The ``lastmile`` command line. Each subcommand lives in its own module under ``simulator.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import LastmileError

COMMANDS = {
    "run": "simulator.commands.run",
    "measure-cpu": "simulator.commands.measure",
    "measure-gpu": "simulator.commands.measure_gpu",
    "validate": "simulator.commands.validate",
    "calibrate": "simulator.commands.calibrate",
    "sweep": "simulator.commands.sweep",
    "report": "simulator.commands.report",
}


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = argparse.ArgumentParser(prog="lastmile", description="Where does the time go between a request "
                                     "and its answer reaching the user? A discrete-event simulator of inference "
                                     "pipelines: GPU compute versus the last mile.")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, path in COMMANDS.items():
        module = importlib.import_module(path)
        modules[name] = module
        module.add_arguments(sub.add_parser(name, help=module.HELP.replace("%", "%%"), description=module.HELP))
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    try:
        return modules[args.command].main(args) or 0
    except LastmileError as exc:
        print(f"lastmile: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("lastmile: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
