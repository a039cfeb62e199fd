"""Command-line tools: ``python -m pyddp.tools.flight_recorder DIR``, ``python -m
pyddp.tools.timeline``, ``python -m pyddp.tools.tune`` (this host's rules of algorithm choice)."""
