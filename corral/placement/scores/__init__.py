"""One module per policy. Each exposes a class implementing `corral.placement.context.Policy`."""
