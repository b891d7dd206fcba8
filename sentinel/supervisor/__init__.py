"""Holding the job through its attempts: ``sentinel run`` and ``sentinel watch``.

``core.Supervisor`` runs the one loop (``event_loop``) that receives the sources' events
(``inbox``, ``shedding`` when they come too fast) and hands those that move the job to
one machine (``machine``), the only place the job's phase changes::

    NEW ─► WAITING ─► STARTING ─► RUNNING ─► STOPPING ─► SETTLING ─► BACKOFF ─► STARTING …
    (watch) └──────────────┴────────┴─ ended by itself ─┴─► EXITED | FATAL | WAITING (watch)
    NEW ─(take-up of a plan a dead sentinel left)─► STOPPING | SETTLING | BACKOFF

The machine is built around the stop plan (``stop_journal``): the best-effort record
before the first signal (STOPPING), the durable plan before the first move, the final
verdict (SETTLING); a sentinel that starts on an unfinished plan enters where it says.
It decides; the others carry out: ``attempts`` starts or finds each attempt (``holders``:
a child it launched, one it adopted or attached to), ``stops`` and ``stopping`` send the
signals, ``aftermath`` and ``restarts`` roll back, write the verdict and say what follows,
``job_status`` says how it goes. The threads around the loop are ``workers``.

It may import every package below the CLI; only ``cli`` imports it.
"""
