"""What an incident's record holds: evidence before a stop, the diagnosis, the report.

``capture`` takes the job's state before the kill (``stacks``: py-spy), ``diagnosis``
(``diagnosis_nan``) reads the evidence the way the runbooks do, ``report`` writes the
alert journal and incident reports, ``chart`` draws the incident.

It may import process (to read the job's tree), the store and the model.
"""
