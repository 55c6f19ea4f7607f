"""The local backend checks this machine's Slurm before it starts anything (no Slurm is started here)."""

import pytest

from clusters import services
from clusters.backends.local import preflight
from clusters.choices import ClusterStatus, OperationStatus
from clusters.models import Operation
from clusters.operations import engine

from .conftest import example_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_jwt_plugin(tmp_path, monkeypatch):
    """A plugin folder with everything the local backend needs but auth_jwt.so, as on a fresh Debian."""
    for plugin in preflight.PLUGINS:
        if plugin != "auth_jwt.so":
            (tmp_path / plugin).touch()
    monkeypatch.setenv("LOCAL_SLURM_PLUGIN_DIR", str(tmp_path))


def test_it_finds_nothing_missing_on_a_machine_set_up_by_bootstrap():
    assert preflight.problem() == ""


def test_it_names_the_missing_jwt_plugin_and_the_package_that_brings_it(no_jwt_plugin):
    line = preflight.problem()
    assert "Slurm plugin auth_jwt.so" in line
    assert line.endswith("apt-get install slurm-wlm-jwt-plugin")
    assert "auth_munge.so" not in line and "\n" not in line


def test_a_create_without_the_plugin_fails_at_its_first_step_with_that_line(no_jwt_plugin, alpha, alice):
    operation = services.create_cluster(project=alpha, name="nojwt", spec=example_spec(), user=alice)
    engine.run(operation.pk)
    operation = Operation.objects.get(pk=operation.pk)
    assert operation.status == OperationStatus.FAILED
    assert operation.error == preflight.problem()
    assert operation.step.startswith("Prepare the cluster directory")
    assert operation.cluster.status == ClusterStatus.FAILED
