"""`corral sim fair`: an online replay with users, comparing FIFO, backfill, fair share and preemption.

    workload.py  trace pods -> jobs with users (seeded Zipf draw), durations and the users' time limits
    replay.py    the event loop and one scheduling round per policy
    metrics.py   what the report measures: allocation, JCT by size, waits, Jain's index, preemption waste
    report.py    table (CSV, JSON, Markdown) and a self-contained HTML page with its plots

See docs/sim-fairness.md for the definitions.
"""
