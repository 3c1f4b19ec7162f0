"""Runnable examples: ``python -m sbm_pyg.examples.gps``."""
