"""The queues file on disk: `corral.queue.config.load_queues` reads it (the one I/O of the queues' configuration, for
`corral serve --queues` and `corral k8s scheduler --queues`). Everything else of tenancy is `corral.tenancy`
(docs/tenancy.md); the names that moved from here are imported from there."""
