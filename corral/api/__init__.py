"""The HTTP API of `corral serve`, spoken over its Unix socket."""
