"""What sentinel keeps in its state dir: SQLite state, its lock, the verdicts.

``state`` is the SQLite store (offsets, outbox, counters) and its private files;
``lock`` keeps one sentinel per state dir; ``verdict`` and ``run_verdict`` write and read
what sentinel decided, for the orchestrator.

It imports nothing of sentinel's above the model.
"""
