"""Mesos-era formats at the edge: Metronome jobs, Chronos jobs and Marathon apps, validated with their source
systems' errors and mapped onto corral's own model (`corral.mesos.model`). Pure: no store, no clock, no I/O."""
