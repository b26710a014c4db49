"""Aggregator."""
