"""The real node's fixtures: one node for the run, joined to the session's API server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.kube_api import KubeApiServer
from tests.support.kube_node import KubeNode, running_node


@pytest.fixture(scope="session")
def kube_node(kube_api: KubeApiServer) -> Iterator[KubeNode]:
    """containerd, the kubelet, the scheduler and the controller manager (tests/support/kube_node.py)."""
    with running_node(kube_api) as node:
        yield node
