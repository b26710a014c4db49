"""Conformance vectors of the fedldp wire contract, version 1 (conformance/v1/*.json).

Generated from the Python reference by `python -m conformance.generate`; every SDK
(Python, TypeScript, any port) is tested against the files, not against itself.
The format is documented in docs/sdk.md ("Conformance vectors").
"""
