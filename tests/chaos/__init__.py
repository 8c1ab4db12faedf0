"""The seeded chaos soak: a master and five data nodes at RF 2 under continuous load, a
fault schedule drawn from one PRNG seed, and an independent ledger checked at the end.

Run it with ``python -m tests.chaos.run --seed N --seconds S`` (``make soak`` runs the long
version through ``bench/soak.py``); see docs/testing.md, "The chaos soak".
"""
