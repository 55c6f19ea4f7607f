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
    spec["node_pools"][1]["boot_disk"] = {"boot_disk_type": "hyperdisk-balanced", "boot_disk_size_gb": 200}
    assert validate_spec(spec, backends=all_backends())["node_pools"][1]["machine_spec"]["accelerator_count"] == 8


def test_it_boots_hyperdisk_only_machine_types_from_hyperdisk():
    """A3 Ultra and A4 take no Persistent Disk (Compute refuses the create); say so before it does."""
    spec = example_spec()
    pool = spec["node_pools"][1]
    pool["machine_spec"] = {"machine_type": "a3-ultragpu-8g"}
    pool["boot_disk"] = {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": 200}
    assert errors_of(spec)["node_pools[1].boot_disk.boot_disk_type"] == [
        "a3-ultragpu-8g takes Hyperdisk only (hyperdisk-balanced, ...), not pd-ssd"
    ]
    del pool["boot_disk"]
    assert "boots from Hyperdisk only" in errors_of(spec)["node_pools[1].boot_disk.boot_disk_type"][0]
    pool["boot_disk"] = {"boot_disk_type": "hyperdisk-balanced", "boot_disk_size_gb": 200}
    validate_spec(spec, backends=all_backends())


def test_it_keeps_a3_mega_subnets_off_dockers_bridges():
    spec = with_console(network={"create": True, "subnet_range": "172.20.0.0/16"})
    validate_spec(spec, backends=all_backends())  # a CPU cluster runs no Docker
    spec["node_pools"][1]["machine_spec"] = {"machine_type": "a3-megagpu-8g"}
    assert "run Docker" in errors_of(spec)["console.network.subnet_range"][0]


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


def with_console(**block):
    spec = example_spec()
    spec["console"].update(block)
    return spec


def test_it_accepts_a_full_console_block_and_keeps_every_value():
    network = {"create": True, "mtu": 8896, "subnet_range": "10.0.0.0/16", "private_services_range": "10.100.0.0/20"}
    storage = {
        "filestore_home": {"tier": "HIGH_SCALE_SSD", "capacity_gb": 10240},
        "lustre": {"performance_tier": 1000, "capacity_gb": 1_530_000, "mount_point": "/lustre"},
        "gcs_buckets": [{"bucket": "ckpts", "mount_point": "/gcs-checkpoints", "mount_options": ["implicit-dirs"]}],
    }
    validated = validate_spec(with_console(network=network, storage=storage), backends=all_backends())
    assert (validated["console"]["network"], validated["console"]["storage"]) == (network, storage)


@pytest.mark.parametrize(
    ("network", "path", "message"),
    [
        (
            {"create": True, "mtu": 9000, "subnet_range": "10.0.0.0/16"},
            "console.network.mtu",
            "must be one of 1460, 1500, 8896",
        ),
        ({"create": True}, "console.network.subnet_range", "is required when the console creates the network"),
        (
            {"create": True, "subnet_range": "8.8.8.0/24"},
            "console.network.subnet_range",
            "must be a private IPv4 range",
        ),
        ({"create": True, "subnet_range": "10.0.0.0/33"}, "console.network.subnet_range", "must be a CIDR range"),
        (
            {"create": True, "subnet_range": "10.0.0.0/16", "private_services_range": "10.0.128.0/20"},
            "console.network.private_services_range",
            "overlaps the subnet range 10.0.0.0/16",
        ),
        (
            {"create": True, "subnet_range": "10.0.0.0/16", "private_services_range": "10.200.0.0/28"},
            "console.network.private_services_range",
            "must be a /16 to /24 range",
        ),
    ],
)
def test_it_checks_the_network_to_create(network, path, message):
    assert message in errors_of(with_console(network=network))[path][0]


def test_it_needs_an_existing_network_name_when_not_creating_one():
    spec = with_console(network={"create": False})
    del spec["network"]
    assert "name an existing VPC network" in errors_of(spec)["network.network"][0]


@pytest.mark.parametrize(
    ("storage", "path", "message"),
    [
        (
            {"filestore_home": {"tier": "GOLD", "capacity_gb": 1024}},
            "console.storage.filestore_home.tier",
            "must be one of",
        ),
        (
            {"filestore_home": {"tier": "BASIC_SSD", "capacity_gb": 1024}},
            "console.storage.filestore_home.capacity_gb",
            "BASIC_SSD holds 2,560 to 65,434 GB",
        ),
        (
            {"lustre": {"performance_tier": 300, "capacity_gb": 18000}},
            "console.storage.lustre.performance_tier",
            "must be one of 125, 250, 500, 1000",
        ),
        (
            {"lustre": {"performance_tier": 125, "capacity_gb": 36000}},
            "console.storage.lustre.capacity_gb",
            "holds 72,000 to 12,240,000 GiB",
        ),
        (
            {"lustre": {"performance_tier": 250, "capacity_gb": 40000}},
            "console.storage.lustre.capacity_gb",
            "multiple of 36,000 GiB",
        ),
        (
            {"lustre": {"performance_tier": 1000, "capacity_gb": 1_548_000}},
            "console.storage.lustre.capacity_gb",
            "multiple of 72,000 GiB",
        ),
        (
            {"gcs_buckets": [{"bucket": "Bad_Bucket!", "mount_point": "/data"}]},
            "console.storage.gcs_buckets[0].bucket",
            "must be a bucket name",
        ),
        (
            {"gcs_buckets": [{"bucket": "ok-bucket", "mount_point": "data"}]},
            "console.storage.gcs_buckets[0].mount_point",
            "absolute path",
        ),
        (
            {"gcs_buckets": [{"bucket": "aaa", "mount_point": "/d"}, {"bucket": "bbb", "mount_point": "/d"}]},
            "console.storage.gcs_buckets[1].mount_point",
            "already the mount point",
        ),
        (
            {"gcs_buckets": [{"bucket": "aaa", "mount_point": "/d", "mount_options": ["a b"]}]},
            "console.storage.gcs_buckets[0].mount_options[0]",
            "one gcsfuse option",
        ),
    ],
)
def test_it_checks_the_storage_to_create(storage, path, message):
    assert message in errors_of(with_console(storage=storage))[path][0]


def test_it_needs_a_private_services_range_for_filestore_on_a_new_network():
    spec = with_console(
        network={"create": True, "subnet_range": "10.0.0.0/16"},
        storage={"filestore_home": {"tier": "ZONAL", "capacity_gb": 1024}},
    )
    assert "is required to create Filestore" in errors_of(spec)["console.network.private_services_range"][0]


@pytest.mark.parametrize(
    ("slurm", "path"),
    [
        ({"accounting": {"accounting_storage_enforce": "limits,bogus"}}, "accounting.accounting_storage_enforce"),
        ({"scheduling": {"priority_type": "priority/random"}}, "scheduling.priority_type"),
        ({"scheduling": {"preempt_mode": "REQUEUE,EXPLODE"}}, "scheduling.preempt_mode"),
        ({"scheduling": {"priority_weight_age": -1}}, "scheduling.priority_weight_age"),
        ({"scheduling": {"preempt_exempt_time": "ten minutes"}}, "scheduling.preempt_exempt_time"),
        ({"scheduling": {"fair": 1}}, "scheduling.fair"),
        ({"prolog_bash_scripts": [7]}, "prolog_bash_scripts[0]"),
    ],
)
def test_it_checks_slurm_settings(slurm, path):
    spec = example_spec()
    spec["orchestrator_spec"]["slurm_spec"].update(slurm)
    assert f"orchestrator_spec.slurm_spec.{path}" in errors_of(spec)


def test_it_accepts_the_services_scheduling_settings_and_keeps_every_value():
    accounting = {"accounting_storage_enforce": "associations,limits,qos"}
    scheduling = {
        "priority_type": "priority/multifactor",
        "priority_weight_age": 1000,
        "priority_weight_fairshare": 10000,
        "preempt_type": "preempt/qos",
        "preempt_mode": "REQUEUE",
        "preempt_exempt_time": "00:10:00",
    }
    spec = example_spec()
    spec["orchestrator_spec"]["slurm_spec"].update(accounting=dict(accounting), scheduling=dict(scheduling))
    slurm = validate_spec(spec, backends=all_backends())["orchestrator_spec"]["slurm_spec"]
    assert (slurm["accounting"], slurm["scheduling"]) == (accounting, scheduling)


def test_it_checks_labels_as_compute_engine_takes_them_and_keeps_the_consoles_own():
    spec = example_spec()
    spec["labels"] = {"team": "dana", "Cost Center": "x", "tcc-cluster": "theirs", "env": "Prod", "costCenter": "y"}
    spec["description"] = 5
    errors = errors_of(spec)
    assert "keys are 1-63 lowercase" in errors["labels.Cost Center"][0]
    assert "keys are 1-63 lowercase" in errors["labels.costCenter"][0]  # a map's keys are not camelCase fields
    assert errors["labels.tcc-cluster"] == ["is the console's own label"]
    assert "values are 0-63 lowercase" in errors["labels.env"][0]
    assert "must be text" in errors["description"][0]
    spec["labels"] = {"team": "dana", "cost-center": "ml-42"}
    spec["description"] = "Dana's team"
    assert validate_spec(spec, backends=all_backends())["labels"] == {"team": "dana", "cost-center": "ml-42"}
