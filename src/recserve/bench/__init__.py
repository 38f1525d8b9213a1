"""Load tests with perf_analyzer: sweeps over layouts and load levels, a report and plots."""
