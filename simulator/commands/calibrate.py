"""``lastmile calibrate``: fit a hardware profile to measured runs (being written)."""

HELP = "fit achievable GPU fractions and CPU costs to measured runs; write a hardware profile"


def add_arguments(p) -> None:
    p.add_argument("measurements")


def main(args) -> int:
    raise NotImplementedError
