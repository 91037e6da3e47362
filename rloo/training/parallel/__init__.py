"""Processes: data-parallel collectives and FSDP2 sharding."""
