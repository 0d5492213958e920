"""Jobs of `corral serve`: what was submitted, its life cycle, and how it is stored."""
