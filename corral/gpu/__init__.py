"""GPU discovery: NVML on real machines, a clearly labelled simulated inventory elsewhere."""
