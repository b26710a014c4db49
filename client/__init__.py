"""Device SDK."""
