"""What flows through the pipeline and what sentinel knows of the run, as plain data.

``records`` (lines, samples, alerts, blocks), ``incidents`` (alerts grouped into episodes),
``facts`` (what the log states in passing), ``cost`` (money), ``machine`` (the names of the
GPU and process-tree samples), ``secrets`` (what must be masked in every line written),
``untrusted`` (the job's words and file names made safe where they are shown), ``bounds``
(the limits every setting keeps, for every package's settings tables).

The bottom of the house: it imports nothing of sentinel's.
"""
