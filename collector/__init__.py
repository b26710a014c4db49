"""Collector daemon."""
