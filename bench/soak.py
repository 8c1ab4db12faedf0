"""The long chaos soak (``make soak``): ``python -m bench.soak [--minutes 10] [--seed N]``.

Runs ``tests.chaos.run`` with a fault window of ``--minutes``, a random seed unless one is
given (printed first thing: replay with ``--seed``), and writes the figures to
``bench/results/soak.md`` and ``soak.json``. Exit status 1 when any check failed.
``--masters 3``: against a master set, with its own faults in the schedule (the leader
killed -9 or SIGSTOPped past its lease, cut off from the elector or from the other
members; a standby wiped and re-added; docs/testing.md); figures in ``soak-masters.md`` /
``.json``.
"""

from __future__ import annotations

import argparse
import os
import sys

from tests.chaos import run

OUT = os.path.join(os.path.dirname(__file__), "results")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--out", default=OUT)
    p.add_argument("--swarm-seconds", type=float, default=60.0)
    p.add_argument("--masters", type=int, default=1, choices=(1, 3, 5),
                   help="a master set, with its own faults in the schedule (soak-masters.md)")
    a, rest = p.parse_known_args(argv)
    os.makedirs(a.out, exist_ok=True)
    stem = "soak" if a.masters == 1 else "soak-masters"
    args = ["--seconds", str(a.minutes * 60), "--swarm-seconds", str(a.swarm_seconds),
            "--report", os.path.join(a.out, f"{stem}.md"),
            "--json", os.path.join(a.out, f"{stem}.json"), "--masters", str(a.masters),
            *rest]
    if a.seed is not None:
        args += ["--seed", str(a.seed)]
    return run.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
