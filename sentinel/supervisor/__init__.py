"""Holding the job through its attempts: ``sentinel run`` and ``sentinel watch``.

``core.Supervisor`` runs the one loop (``event_loop``) that receives the sources' events
(``inbox``, ``shedding`` when they come too fast), holds the job (``holders``: a child it
launched, one it adopted or attached to), stops it (``stops``, ``stopping``), decides what
follows (``aftermath``, ``restarts``: rollback, restart or give up) and says how it goes
(``job_status``). The threads around the loop are ``workers``.

It may import every package below the CLI; only ``cli`` imports it.
"""
