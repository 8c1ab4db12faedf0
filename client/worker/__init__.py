"""The worker runtime: ``Worker`` (``runtime.py``), its acknowledgements (``acker.py``) and its
parts."""
