"""fedldp: collect statistics from devices under local differential privacy.

`fedldp.Client` is the device SDK's entry point (see fedldp.client).
"""

from __future__ import annotations

from typing import Any

__all__ = ["Client"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import fedldp` stays light on devices and the CLI starts fast.
    if name == "Client":
        from fedldp.client.sdk import Client

        return Client
    raise AttributeError(f"module 'fedldp' has no attribute {name!r}")
