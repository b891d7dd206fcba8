"""Helpers for testing sentinel, and code built on it, on machines without the real hardware.

``sentinel.testing.nvml.FakeNvml`` stands in for the ``pynvml`` module: scriptable GPUs,
XID events, and the real ``pynvml`` error classes raised where the real library raises them.
"""
