"""The worker runtime: ``Worker`` and its counters (``runtime.py``), its acknowledgements
(``acker.py``), what a handler is (``handlers.py``) and the threads sync handlers run in
(``threads.py``)."""
