"""corral serve: the loop that wires store, engine and executor."""
