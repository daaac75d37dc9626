"""Fixtures of the Python client's tests: a real coordinator and two stage workers on 127.0.0.1
(pipetrain.local.LocalCluster: the built binaries named by PIPETRAIN_COORDINATOR_BINARY /
PIPETRAIN_STAGE_WORKER_BINARY, which CTest sets; stopped by their PIDs)."""

import os

import pytest

import pipetrain
from pipetrain.local import LocalCluster

SOURCE_DIR = os.environ.get(
    "PIPETRAIN_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


class Daemons:
    """The cluster and a client connected to it."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.address = cluster.address
        self.checkpoint_root = cluster.checkpoint_root
        self.client = pipetrain.Client(cluster.address)

    def idle_workers(self):
        return [w.name for w in self.client.workers() if not w.job]


@pytest.fixture(scope="module")
def daemons(tmp_path_factory):
    cluster = LocalCluster(workers=2, log_dir=str(tmp_path_factory.mktemp("daemons")))
    d = Daemons(cluster)
    yield d
    d.client.close()
    cluster.stop()


@pytest.fixture
def example():
    """Path of an example file in the source tree's examples/."""
    return lambda name: os.path.join(SOURCE_DIR, "examples", name)
