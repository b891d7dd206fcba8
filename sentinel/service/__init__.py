"""sentinel as a service beside the job, and the live pipeline every live mode shares.

``watch`` joins the engine, incidents, journal, reports and notifications; ``memory``
keeps what the engine knows in the state dir; ``health``, ``http``, ``metrics`` and
``sdnotify`` tell the orchestrator how sentinel is (``/livez``, ``/readyz``, ``/metrics``,
``READY=1``); ``status`` and ``verdict_wait`` read the state dir for ``sentinel status``
and ``sentinel verdict``.

It may import the engine and everything below it; only ``supervisor`` and ``cli`` import it.
"""
