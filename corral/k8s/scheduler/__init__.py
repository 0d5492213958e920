"""`corral k8s scheduler`: a standalone Kubernetes scheduler on corral's engine (issue 24).

    core.Scheduler   informers -> queue -> batch step -> Bindings (rate-limited, concurrent) + pending reasons
    batch            the pure batch step: (pending pods in arrival order, the books) -> Bind | Wait per pod
    metrics          Prometheus metrics; http: GET /metrics, /healthz, /readyz, /explain/NS/POD
    events           the one Event body every Event of the scheduler's (and of its evictions) is written with

The books are `corral.k8s.state.ClusterState`, shared with the extender: every bound pod counts, any scheduler's.
"""
