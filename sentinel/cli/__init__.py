"""The ``sentinel`` command: its parser (``main``), the options the verbs share
(``options``) and one module a verb (``verbs/``).

The top of the house: only this package prints to the terminal or exits. It may import
everything below it; nothing imports it.
"""

from sentinel.cli import startup

startup.hold()  # before any module below imports pydantic (``startup``)
try:
    import sentinel.cli.main  # noqa: F401  # the parser and the settings' models, built held
finally:
    # Given back once they are built: a program that imports sentinel.cli and never calls
    # main() keeps its environment as it was.
    startup.release()
