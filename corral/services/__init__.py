"""Services (Marathon apps) on `corral serve`: keep instances running, ports, health checks, constraints."""
