"""The job's processes: launched under a relay, adopted, attached, identified, signalled.

``launched`` starts an attempt (under ``relay``, the stdlib-only process that holds its
terminals, ``relayed`` its sentinel side, ``relay_copies`` the files it writes);
``adopted`` takes a job an earlier sentinel left running; ``attached`` and ``target``
find one started elsewhere (``systemd_unit``); ``identity`` and ``pidfd`` make sure a
pid is still the job's; ``proctree`` reads the job's tree and ``signal_tree`` stops it;
``system`` reads the tree and the GPUs on their own threads.

It may import follow, gpu, store and the model.
"""
