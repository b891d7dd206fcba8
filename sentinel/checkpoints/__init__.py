"""Checkpoints: found and judged, kept, set aside, pointed at, restored.

``scan`` lists a checkpoint dir (Lightning's ``lightning_logs``: every version's
``checkpoints/``) and judges each checkpoint (``names``, ``files``,
``layouts``, ``torch_pickle``: read without unpickling); ``keep`` keeps clean copies of
files the job overwrites (``clone``: reflink, link or copy); ``rollback`` moves what came
after the last clean one into ``quarantine`` and sets the resume ``pointers``
(``pointer_find``) right (``atomic`` replaces); ``restore`` undoes a rollback (both move across
filesystems by ``cross_device``: a copy, then removal); ``disk`` says what all this takes.

It may import the model only; it never deletes a checkpoint.
"""
