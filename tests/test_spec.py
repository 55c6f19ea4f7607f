"""The spec validator: the managed service's rules, with every error naming its field path."""

import pytest
from django.test import override_settings

from clusters.backends import all_backends
from clusters.spec import SpecError, validate_spec

from .conftest import example_spec


def errors_of(spec):
    with pytest.raises(SpecError) as info:
        validate_spec(spec, backends=all_backends())
    return info.value.errors


def test_it_accepts_the_shipped_example():
    spec = validate_spec(example_spec(), backends=all_backends())
    assert spec["display_name"] == "demo"


def test_it_accepts_camel_case_and_returns_snake_case():
    spec = example_spec()
    spec["displayName"] = spec.pop("display_name")
    spec["nodePools"] = spec.pop("node_pools")
    for pool in spec["nodePools"]:
        pool["scalingSpec"] = pool.pop("scaling_spec")
        pool["machineSpec"] = {"machineType": pool.pop("machine_spec")["machine_type"]}
    spec["orchestratorSpec"] = {
        "slurmSpec": {"partitions": [{"id": "cpu", "nodePoolIds": ["cpu"]}], "loginNodePoolId": "login"}
    }
    del spec["orchestrator_spec"]
    normalised = validate_spec(spec, backends=all_backends())
    assert normalised["node_pools"][1]["scaling_spec"] == {"min_node_count": 2, "max_node_count": 2}
    assert normalised["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"] == "login"


@pytest.mark.parametrize("name", ["Demo", "1demo", "demo-1", "abcdefghijk", ""])
def test_it_rejects_display_names_the_service_rejects(name):
    spec = example_spec()
    spec["display_name"] = name
    assert "display_name" in errors_of(spec)


def test_it_requires_min_to_equal_max_node_count():
    spec = example_spec()
    spec["node_pools"][1]["scaling_spec"] = {"min_node_count": 1, "max_node_count": 4}
    assert "min_node_count must equal" in errors_of(spec)["node_pools[1].scaling_spec"][0]


def test_it_matches_accelerator_type_to_machine_type():
    spec = example_spec()
    spec["node_pools"][1]["machine_spec"] = {
        "machine_type": "a3-ultragpu-8g",
        "accelerator_type": "NVIDIA_B200",
        "accelerator_count": 8,
    }
    errors = errors_of(spec)
    assert errors["node_pools[1].machine_spec.accelerator_type"] == [
        "a3-ultragpu-8g comes with NVIDIA_H200_141GB, not NVIDIA_B200"
    ]


def test_it_accepts_a_gpu_pool_with_its_own_accelerators():
    spec = example_spec()
    spec["node_pools"][1]["machine_spec"] = {
        "machine_type": "a4-highgpu-8g",
        "accelerator_type": "NVIDIA_B200",
        "accelerator_count": 8,
    }
    assert validate_spec(spec, backends=all_backends())["node_pools"][1]["machine_spec"]["accelerator_count"] == 8


def test_it_rejects_accelerators_on_a_cpu_machine_and_unknown_machines():
    spec = example_spec()
    spec["node_pools"][0]["machine_spec"] = {"machine_type": "n2-standard-8", "accelerator_type": "NVIDIA_B200"}
    spec["node_pools"][1]["machine_spec"] = {"machine_type": "n9-mega-3"}
    errors = errors_of(spec)
    assert errors["node_pools[0].machine_spec.accelerator_type"] == ["n2-standard-8 has no accelerators"]
    assert errors["node_pools[1].machine_spec.machine_type"] == ["unknown machine type 'n9-mega-3'"]


def test_it_requires_every_partition_pool_to_exist_and_keeps_login_out_of_partitions():
    spec = example_spec()
    spec["orchestrator_spec"]["slurm_spec"]["partitions"] = [{"id": "cpu", "node_pool_ids": ["cpu", "gpu", "login"]}]
    errors = errors_of(spec)
    assert errors["orchestrator_spec.slurm_spec.partitions[0].node_pool_ids[1]"] == ["no node pool has id 'gpu'"]
    assert errors["orchestrator_spec.slurm_spec.partitions[0].node_pool_ids[2]"] == [
        "the login pool cannot be in a partition"
    ]


def test_it_requires_the_login_pool_to_exist():
    spec = example_spec()
    spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"] = "head"
    assert errors_of(spec)["orchestrator_spec.slurm_spec.login_node_pool_id"] == ["no node pool has id 'head'"]


def test_it_keeps_all_pools_in_one_zone_of_an_offered_region():
    spec = example_spec()
    spec["node_pools"][1]["zone"] = "us-east5-b"
    assert "all node pools must be in one zone" in errors_of(spec)["node_pools"][0]
    spec["node_pools"][1]["zone"] = "moon-base1-a"
    assert "is not offered" in errors_of(spec)["node_pools[1].zone"][0]


def test_it_requires_a_reservation_for_the_reservation_model():
    spec = example_spec()
    spec["node_pools"][1]["provisioning_model"] = "RESERVATION"
    assert "node_pools[1].machine_spec.reservation_affinity" in errors_of(spec)


def test_it_names_unknown_fields_so_typos_are_caught():
    spec = example_spec()
    spec["node_pools"][1]["scalling_spec"] = {}
    assert errors_of(spec)["node_pools[1].scalling_spec"] == ["unknown field"]


def test_it_reports_every_problem_at_once():
    spec = example_spec()
    spec["display_name"] = "BAD"
    spec["node_pools"][1]["provisioning_model"] = "CHEAP"
    spec["node_pools"][1]["boot_disk"]["boot_disk_size_gb"] = 1
    errors = errors_of(spec)
    assert {"display_name", "node_pools[1].provisioning_model", "node_pools[1].boot_disk.boot_disk_size_gb"} <= set(
        errors
    )


def test_it_rejects_an_unknown_backend():
    spec = example_spec()
    spec["console"]["backend"] = "moon"
    assert "unknown backend 'moon'" in errors_of(spec)["console.backend"][0]


@override_settings(LOCAL_MAX_NODES=3)
def test_it_applies_the_local_backends_node_limit():
    assert "at most 3 compute nodes" in errors_of(example_spec(cpu=4))["node_pools"][0]


def test_it_rejects_a_spec_that_is_not_an_object():
    assert errors_of(["not", "an", "object"]) == {"spec": ["must be a JSON object"]}
