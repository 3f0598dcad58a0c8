"""Monitoring: events and metrics."""
