"""The GPUs, through NVML: readings, attribution to the job, XID events.

``nvml`` is the ``GpuProbe`` boundary (pynvml's calls and errors, faked in tests),
``reading`` reads each GPU, ``xid`` waits for XID errors, ``monitor`` runs them on their
own threads; ``settings`` is ``[gpu]``. Without NVML the GPU rules are off.

It may import the model only.
"""
