"""Triton python models; each file is copied into the repository as ``<model>/<version>/model.py``."""
