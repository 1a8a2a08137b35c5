"""Several training jobs on one mixed cluster (pure: no Prefect, no torch, no I/O).

`jobs` (what a job and a worker kind are, and the one-line refusals at submission),
`allocate` (which workers each job holds: weighted proportional fairness over each job's
throughput normalised by its throughput alone on the whole cluster), `switch` (whether moving
workers gains more than the switch costs), `fifo` (first come, first served, blind to the
device type: the baseline), `replay` (the queue's policies replayed on the step-time model,
event by event).
"""
