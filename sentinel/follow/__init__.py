"""Following output: byte streams into lines, files followed the way ``tail -F`` does.

``gathering`` decides when a reader hands on what it read (split into lines by
``sentinel.parsing.lines``), ``terminal_text`` cleans what a job wrote to a terminal;
``logfile`` follows one file with offsets that outlive sentinel, ``tailer`` runs the
followers on one thread,
woken by ``tail_wakeups`` through ``inotify``; ``discover`` finds the metric files a
framework writes. No formats here: a followed path's splitter is handed in
(``sentinel.supervisor.metric_files``).

It may import parsing's line splitting, the model, the store and the checkpoint scan (to
skip quarantine folders); parsing never imports it.
"""
