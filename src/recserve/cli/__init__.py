"""The ``recserve`` command line: one module a verb, heavy imports inside each command."""
