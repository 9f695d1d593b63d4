"""The whole fault matrix against a real apiserver, printed as a table.

    .venv/bin/python -m tests.faults.matrix            # every scenario (~5 min on 2 cores)
    .venv/bin/python -m tests.faults.matrix --fast     # the CI subset
    .venv/bin/python -m tests.faults.matrix -k stall,410   # names containing "stall" or "410"

Exit status 1 if any scenario was not survived. Needs root only for the full-disk scenario
(a tmpfs mount).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import tempfile
import traceback
from pathlib import Path

from tests.faults.env import FaultEnv
from tests.faults.scenarios import SCENARIOS, Result, run


def table(results: list[Result]) -> str:
    head = ["fault", "survived", "lost/dup", "writes (needed)", "extra (bound)", "recover s"]
    head.append("LISTs")
    rows = [
        (
            r.fault,
            "yes" if r.survived else "NO",
            f"{r.lost}/{r.duplicated}",
            f"{r.writes} ({r.needed})",
            f"{r.extra_writes} (≤ {r.allowed_extra})",
            "-" if math.isnan(r.recover_s) else f"{r.recover_s:.1f}",
            str(r.lists),
        )
        for r in results
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    notes = [f"- {r.fault}: {r.note}" for r in results if r.note]
    return "\n".join(lines + (["", *notes] if notes else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", help="only the CI subset")
    parser.add_argument(
        "-k", default="", help="only scenarios whose name contains this (several: a,b)"
    )
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: every case's agent and plugin are killed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    words = args.k.split(",")
    chosen = [s for s in SCENARIOS if (s.fast or not args.fast) and any(w in s.name for w in words)]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="nodeagent-faults-"))
    results: list[Result] = []
    with FaultEnv.start(workdir) as env:
        for sc in chosen:
            print(f"... {sc.name}", file=sys.stderr, flush=True)
            try:
                results.append(run(env, sc))
            except Exception as exc:
                traceback.print_exc()
                nan = float("nan")
                results.append(Result(sc.name, False, -1, -1, -1, 0, nan, -1, repr(exc)))
            print(table(results[-1:]).splitlines()[2], file=sys.stderr, flush=True)
    print(table(results))
    print(f"\nlogs: {workdir}")
    return 0 if all(r.survived for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
