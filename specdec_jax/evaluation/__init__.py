"""Evaluation helpers: exactness checks and reports for quality-vs-latency sweeps."""
