"""Reusable test helpers: real servers on free ports."""
