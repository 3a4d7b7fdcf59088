"""``ray`` (the CLI), except that a loopback host stays loopback: the test clusters' nodes.

Why: tests may reach loopback addresses only. Ray takes a loopback
``--node-ip-address`` or ``--address`` host for "this machine" and swaps in the machine's own
network address (``ray._private.services.resolve_ip_for_localhost``): a node started with
``--node-ip-address=127.0.0.1`` registers under that address, its GCS and raylet listen on
it, and every process of the cluster talks to the others over it. Ray's one switch against
that, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, also makes ``ray start --address`` refuse to
add a node, so a test cluster of several nodes cannot use it.

Here the swap keeps a loopback host as given, for the ``ray start`` that runs in this process;
the processes it starts get ``127.0.0.1`` in their arguments (the GCS, the raylet and its
agents then listen on loopback only, and a worker takes its node's address). Drivers get the
same from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (``tests.ray_cluster.RAY_ENV``).
``tests.ray_cluster.loopback_only`` checks the result on every socket. Test-only: never for a
real cluster, whose nodes must be reachable from the others.

Run as ``python tests/ray_loopback.py start ...``, with the arguments of ``ray``.
"""

from __future__ import annotations

import ipaddress
import sys

from ray._private import services
from ray.scripts.scripts import main

_resolve = services.resolve_ip_for_localhost


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def keep_loopback(host: str) -> str:
    """``host`` itself where it names this machine's loopback; Ray's resolution otherwise."""
    if is_loopback(host):
        return host
    resolved: str = _resolve(host)
    return resolved


services.resolve_ip_for_localhost = keep_loopback

if __name__ == "__main__":
    sys.argv[0] = "ray"
    sys.exit(main())  # type: ignore[no-untyped-call]
