"""The engine: the one owner of detector state, the same live and in replay.

``core.Engine`` shows each line's samples (``samples``) or a batch of lines as columns
(``blocks``) to the rules that watch them (``routes``), each rank its own series
(``ranks``), where the run is (``position``), what came before (``history``) and the hooks
every rule has (``hooks``). ``replay`` runs it over finished logs.

It may import config, rules, parsing, evidence's diagnosis and the model; nothing below
imports it.
"""
