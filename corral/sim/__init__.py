"""corral sim: replay cluster traces through the placement engine."""
