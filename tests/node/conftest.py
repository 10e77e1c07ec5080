"""The real node's fixtures: one node for the run, joined to the session's API server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.infra.conftest import platform_runs, set_runs, stack_runs  # noqa: F401  # the stacks' runs under mocks
from tests.support.kube_api import KubeApiServer
from tests.support.kube_node import KubeNode, running_node
from tests.support.mirror_image import MirrorImage, built_image


@pytest.fixture(scope="session")
def kube_node(kube_api: KubeApiServer) -> Iterator[KubeNode]:
    """containerd, the kubelet, the scheduler and the controller manager (tests/support/kube_node.py)."""
    with running_node(kube_api) as node:
        yield node


@pytest.fixture(scope="session")
def mirror_image() -> MirrorImage:
    """The image `images/mirror/build` made from our Dockerfile (tests/support/mirror_image.py)."""
    return built_image()
