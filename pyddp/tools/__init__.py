"""Command-line tools: ``python -m pyddp.tools.flight_recorder DIR``, ``python -m
pyddp.tools.timeline``."""
