"""The trusted release service: analysts query registered datasets over gRPC.

catalog.py (operator's datasets and grants), policy.py (the signed caps),
holds.py (a release charged against its analyst's cap too), engine.py
(authorize -> reserve -> read -> settle -> sign), errorbars.py (public error
bars), server.py (gRPC, authentication, metrics, logs). See
docs/release-service.md.
"""
