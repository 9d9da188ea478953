"""Training of RecursiveMAS links: the inner loop (`inner.py`, one Ray Train run per role) and the
data helpers shared with the outer loop (`data.py`). Import the submodules directly; this package
imports nothing heavy on its own.
"""
