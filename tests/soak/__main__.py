"""`python -m tests.soak --seed N --duration D`: the randomized soak (docs/testing/soak.md).
Exit status 1 on any invariant violation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.soak.runner import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--seed", type=int, required=True, help="the schedule's seed (replay it)")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of events")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="logs and state (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    summary = run(args.seed, args.duration, args.workdir, out=lambda line: print(line, flush=True))
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
