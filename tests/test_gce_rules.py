"""Requests the real Compute API accepts: the fake refuses what Google refuses (tests/fake_rules.py),
in Google's error shape, and the gce backend sends what Google accepts.

Every rule of the fake has a case here: a request the rule refuses, sent with google-cloud-compute as
the console sends its own, and the same request made right, which passes.
"""

from dataclasses import dataclass

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from clusters import services
from clusters.backends import TransientBackendError, get_backend
from clusters.backends.gce import errors
from clusters.backends.gce.names import names
from clusters.models import Cluster, Node
from clusters.operations import engine
from clusters.spec.reference import build_spec

from . import fake_rules
from .gce_fixtures import built, create, gce_spec, run_task, template_of

pytestmark = pytest.mark.django_db

PROJECT, ZONE = "tcc-test", "us-central1-b"
NODES_ACCOUNT = "ultra-nodes@tcc-test.iam.gserviceaccount.com"


def client(fake, cls):
    return cls(credentials=AnonymousCredentials(), transport="rest", client_options={"api_endpoint": fake.endpoint})


def instance(machine="n2-standard-4", disk="zones/us-central1-b/diskTypes/pd-balanced", **scheduling):
    return {
        "name": "vm-1",
        "machine_type": f"zones/{ZONE}/machineTypes/{machine}",
        "disks": [{"boot": True, "initialize_params": {"source_image": "img", "disk_type": disk}}],
        "network_interfaces": [{"network": f"projects/{PROJECT}/global/networks/default"}],
        "scheduling": scheduling,
    }


def template(disk="pd-balanced"):
    return {
        "name": "tpl-1",
        "properties": {
            "machine_type": "n2-standard-4",
            "disks": [{"boot": True, "initialize_params": {"source_image": "img", "disk_type": disk}}],
        },
    }


def insert_instance(fake, body):
    return client(fake, compute_v1.InstancesClient).insert_unary(
        project=PROJECT, zone=ZONE, instance_resource=compute_v1.Instance(body)
    )


def insert_template(fake, body):
    return client(fake, compute_v1.InstanceTemplatesClient).insert_unary(
        project=PROJECT, instance_template_resource=compute_v1.InstanceTemplate(body)
    )


def bulk_insert(fake, count, names_count=None, min_count=None):
    body = {"count": count, "source_instance_template": f"projects/{PROJECT}/global/instanceTemplates/tpl-1"}
    body["per_instance_properties"] = {f"vm-{i}": {"name": f"vm-{i}"} for i in range(names_count or count)}
    if min_count:
        body["min_count"] = min_count
    return client(fake, compute_v1.InstancesClient).bulk_insert_unary(
        project=PROJECT, zone=ZONE, bulk_insert_instance_resource_resource=compute_v1.BulkInsertInstanceResource(body)
    )


def with_access_configs(*configs):
    body = instance()
    body["network_interfaces"] = [{**body["network_interfaces"][0], "access_configs": list(configs)}]
    return body


def with_metadata(size):
    body = instance()
    body["metadata"] = {"items": [{"key": "slurm-conf", "value": "x" * size}]}
    return body


def insert_network(fake, name, **fields):
    return client(fake, compute_v1.NetworksClient).insert_unary(
        project=PROJECT, network_resource=compute_v1.Network(name=name, auto_create_subnetworks=False, **fields)
    )


def insert_firewall(fake, network):
    return client(fake, compute_v1.FirewallsClient).insert_unary(
        project=PROJECT,
        firewall_resource=compute_v1.Firewall(
            name=f"{network}-fw", network=f"projects/{PROJECT}/global/networks/{network}",
            allowed=[compute_v1.Allowed(I_p_protocol="all")], source_tags=["x"],
        ),
    )  # fmt: skip


def reserved(**affinity):
    body = instance(
        "a3-ultragpu-8g", "zones/us-central1-b/diskTypes/hyperdisk-balanced", on_host_maintenance="TERMINATE"
    )
    body["reservation_affinity"] = affinity
    return body


SPECIFIC = {"consume_reservation_type": "SPECIFIC_RESERVATION", "key": fake_rules.RESERVATION_KEY}


def delete_network_in_use(fake, remove_firewall):
    insert_network(fake, "busy")
    insert_firewall(fake, "busy")
    if remove_firewall:
        client(fake, compute_v1.FirewallsClient).delete_unary(project=PROJECT, firewall="busy-fw")
    return client(fake, compute_v1.NetworksClient).delete_unary(project=PROJECT, network="busy")


def setup_template(fake):
    insert_template(fake, template())


def setup_rdma_network(fake):
    insert_network(fake, "roce", network_profile=f"projects/{PROJECT}/global/networkProfiles/{ZONE}-vpc-roce")
    insert_network(fake, "plain")


def setup_placed_reservation(fake):
    fake.resources[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/reservations/dense"] = {
        "name": "dense",
        "resourcePolicies": {"policy": f"projects/{PROJECT}/regions/us-central1/resourcePolicies/their-place"},
    }


TIGHT = f"projects/{PROJECT}/regions/us-central1/resourcePolicies/tight"


def setup_compact_policy(fake):
    fake.resources[f"/compute/v1/{TIGHT}"] = {"name": "tight", "groupPlacementPolicy": {"collocation": "COLLOCATED"}}


X86_GPU_IMAGE = (
    "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2204-amd64-with-nvidia-550"
)
ARM_GPU_IMAGE = (
    "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accelerator-2404-arm64-with-nvidia-570"
)


def booting(machine, image):
    body = instance(machine, f"zones/{ZONE}/diskTypes/hyperdisk-balanced", on_host_maintenance="TERMINATE")
    body["disks"][0]["initialize_params"]["source_image"] = image
    return body


def placed(machine, disk):
    return {**instance(machine, f"zones/{ZONE}/diskTypes/{disk}", on_host_maintenance="TERMINATE"),
            "resource_policies": [TIGHT]}  # fmt: skip


def image_from(fake, stop_first):
    if not any(k.endswith("/instances/vm-1") for k in fake.resources):
        insert_instance(fake, instance())
    if stop_first:
        client(fake, compute_v1.InstancesClient).stop_unary(project=PROJECT, zone=ZONE, instance="vm-1")
    return client(fake, compute_v1.ImagesClient).insert_unary(
        project=PROJECT,
        image_resource=compute_v1.Image(
            name="img-1", family="fam", source_disk=f"projects/{PROJECT}/zones/{ZONE}/disks/vm-1"
        ),
    )


@dataclass
class Case:
    rule: str
    refused: object  # fake -> sends the request Google refuses
    accepted: object  # fake -> sends it made right
    message: str
    setup: object = None
    reason: str = "invalid"


CASES = [
    Case("disk_type_is_a_url_in_instances", lambda f: insert_instance(f, instance(disk="pd-ssd")),
         lambda f: insert_instance(f, instance(disk="zones/us-central1-b/diskTypes/pd-ssd")),
         "Invalid value for field 'resource.disks[0].initializeParams.diskType': 'pd-ssd'. The URL is malformed."),
    Case("disk_type_is_a_name_in_templates",
         lambda f: insert_template(f, template(disk="zones/us-central1-b/diskTypes/pd-ssd")),
         lambda f: insert_template(f, template(disk="pd-ssd")),
         "'resource.properties.disks[0].initializeParams.diskType'"),
    Case("a_vm_boots_an_image_of_its_machines_architecture",
         lambda f: insert_instance(f, booting("a4x-highgpu-4g", X86_GPU_IMAGE)),
         lambda f: insert_instance(f, booting("a4x-highgpu-4g", ARM_GPU_IMAGE)),
         f"Invalid value for field 'resource.disks[0].initializeParams.sourceImage': '{X86_GPU_IMAGE}'. The "
         "image's architecture is not ARM64, the architecture of machine type a4x-highgpu-4g."),
    Case("hyperdisk_only_machine_types_boot_from_hyperdisk",
         lambda f: insert_instance(f, instance("a3-ultragpu-8g", on_host_maintenance="TERMINATE")),
         lambda f: insert_instance(f, instance("a3-ultragpu-8g", "zones/us-central1-b/diskTypes/hyperdisk-balanced",
                                               on_host_maintenance="TERMINATE")),
         "Machine type a3-ultragpu-8g supports only Hyperdisk disk types."),
    Case("gpu_machines_terminate_on_host_maintenance", lambda f: insert_instance(f, instance("a3-megagpu-8g")),
         lambda f: insert_instance(f, instance("a3-megagpu-8g", on_host_maintenance="TERMINATE")),
         "Instances with guest accelerators do not support live migration.", reason="badRequest"),
    Case("spot_and_flex_start_vms_terminate_and_do_not_restart",
         lambda f: insert_instance(f, instance(provisioning_model="SPOT", on_host_maintenance="TERMINATE")),
         lambda f: insert_instance(f, instance(provisioning_model="SPOT", on_host_maintenance="TERMINATE",
                                               automatic_restart=False)),
         "SPOT instances cannot be automatically restarted."),
    Case("reservation_affinity_names_reservations",
         lambda f: insert_instance(f, reserved(**SPECIFIC, values=[f"projects/{PROJECT}/zones/{ZONE}/reservations/x"])),
         lambda f: insert_instance(f, reserved(**SPECIFIC, values=["r1", "projects/other-proj/reservations/r2"])),
         "Must be a reservation name, or projects/PROJECT/reservations/NAME for a shared one."),
    Case("reservation_bound_vms_consume_a_specific_reservation",
         lambda f: insert_instance(f, {**reserved(consume_reservation_type="ANY_RESERVATION"),
                                       "scheduling": {"provisioning_model": "RESERVATION_BOUND",
                                                      "on_host_maintenance": "TERMINATE"}}),
         lambda f: insert_instance(f, {**reserved(**SPECIFIC, values=["r1"]),
                                       "scheduling": {"provisioning_model": "RESERVATION_BOUND",
                                                      "on_host_maintenance": "TERMINATE"}}),
         "RESERVATION_BOUND instances must consume a specific reservation."),
    Case("a_reservation_with_its_own_placement_takes_no_other",
         lambda f: insert_instance(f, {**reserved(**SPECIFIC, values=["dense"]), "resource_policies": ["mine"]}),
         lambda f: insert_instance(f, {**reserved(**SPECIFIC, values=["dense"]), "resource_policies": [
             f"projects/{PROJECT}/regions/us-central1/resourcePolicies/their-place"]}),
         "instances consuming it cannot specify another", setup=setup_placed_reservation),
    Case("compact_placement_takes_its_machine_series_and_size",
         lambda f: insert_instance(f, placed("a4-highgpu-8g", "hyperdisk-balanced")),
         lambda f: insert_instance(f, placed("a3-highgpu-8g", "pd-ssd")),
         "Compact placement policies are not supported for machine type a4-highgpu-8g.",
         setup=setup_compact_policy),
    Case("one_one_to_one_nat_access_config_per_interface",
         lambda f: insert_instance(f, with_access_configs({"name": "a"}, {"name": "b"})),
         lambda f: insert_instance(f, with_access_configs({"name": "External NAT", "type_": "ONE_TO_ONE_NAT"})),
         "Invalid value for field 'resource.networkInterfaces[0].accessConfigs': '2'. Only one access config"),
    Case("metadata_fits_its_limits", lambda f: insert_instance(f, with_metadata(300 * 1024)),
         lambda f: insert_instance(f, with_metadata(200 * 1024)), "exceeds the limit of 262144 bytes"),
    Case("bulk_insert_stays_within_its_count", lambda f: bulk_insert(f, 5001, names_count=1),
         lambda f: bulk_insert(f, 2), "Invalid value for field 'resource.count': '5001'. Must be between 1 and 5000.",
         setup=setup_template),
    Case("network_mtu_in_range", lambda f: insert_network(f, "jumbo", mtu=9000),
         lambda f: insert_network(f, "jumbo", mtu=8896), "Must be between 1300 and 8896."),
    Case("rdma_networks_take_no_firewall_rules", lambda f: insert_firewall(f, "roce"),
         lambda f: insert_firewall(f, "plain"), "not supported on networks with an RDMA (RoCE) network profile",
         setup=setup_rdma_network),
    Case("a_network_in_use_is_not_deleted", lambda f: delete_network_in_use(f, remove_firewall=False),
         lambda f: client(f, compute_v1.NetworksClient).delete_unary(project=PROJECT, network="busy")
         if client(f, compute_v1.FirewallsClient).delete_unary(project=PROJECT, firewall="busy-fw") else None,
         "The network resource 'projects/tcc-test/global/networks/busy' is already being used by "
         "'projects/tcc-test/global/firewalls/busy-fw'", reason="resourceInUseByAnotherResource"),
    Case("machine_type_is_a_url_in_the_instances_zone",
         lambda f: insert_instance(f, {**instance(), "machine_type": "n2-standard-4"}),
         lambda f: insert_instance(f, instance()),
         "Invalid value for field 'resource.machineType': 'n2-standard-4'. The URL is malformed."),
    Case("labels_are_lowercase_and_short",
         lambda f: insert_instance(f, {**instance(), "labels": {"Team": "dana"}}),
         lambda f: insert_instance(f, {**instance(), "labels": {"team": "dana"}}),
         "Label keys and values are lowercase letters"),
    Case("a_vms_service_account_exists",
         lambda f: insert_instance(f, {**instance(), "service_accounts": [{"email": NODES_ACCOUNT}]}),
         lambda f: f.add_service_account(NODES_ACCOUNT)
         or insert_instance(f, {**instance(), "service_accounts": [{"email": NODES_ACCOUNT}]}),
         f"The user does not have access to service account '{NODES_ACCOUNT}'", reason="badRequest"),
    Case("an_image_comes_from_a_disk_no_running_vm_uses", lambda f: image_from(f, stop_first=False),
         lambda f: image_from(f, stop_first=True),
         "The disk resource 'projects/tcc-test/zones/us-central1-b/disks/vm-1' is already being used by "
         "'projects/tcc-test/zones/us-central1-b/instances/vm-1'", reason="resourceInUseByAnotherResource"),
]  # fmt: skip


def test_a_compact_placement_policy_holds_at_most_1500_instances(fake):
    setup_compact_policy(fake)
    for i in range(1499):
        fake.resources[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/held-{i}"] = {
            "resourcePolicies": [TIGHT]
        }
    insert_instance(fake, {**placed("a3-highgpu-8g", "pd-ssd"), "name": "vm-1500"})  # the 1,500th
    with pytest.raises(exceptions.BadRequest) as refused:
        insert_instance(fake, {**placed("a3-highgpu-8g", "pd-ssd"), "name": "vm-1501"})
    assert "holds at most 1500 instances; it holds 1500 and this request adds 1" in refused.value.message


def test_it_gives_no_pool_a_compact_policy_google_would_refuse():
    from clusters.backends.gce.instances import uses_own_placement

    def pool(machine, nodes, most=None):
        scaling = {"min_node_count": nodes, **({"max_node_count": most} if most else {})}
        return {"id": "p", "machine_spec": {"machine_type": machine, "accelerator_count": 8}, "scaling_spec": scaling}

    assert uses_own_placement(pool("a3-megagpu-8g", 16))
    assert uses_own_placement(pool("a3-megagpu-8g", 1500))
    assert not uses_own_placement(pool("a3-megagpu-8g", 1501))  # one policy holds at most 1,500
    assert not uses_own_placement(pool("a3-megagpu-8g", 16, most=2000))  # ... at the pool's largest
    assert not uses_own_placement(pool("a4-highgpu-8g", 16))  # A4: dense only through its reservation


def test_every_rule_of_the_fake_has_a_case_and_a_source():
    assert sorted(c.rule for c in CASES) == sorted(r.name for r in fake_rules.RULES)
    assert all(r.source.startswith("https://cloud.google.com/") for r in fake_rules.RULES)


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_the_fake_refuses_what_google_refuses_in_googles_shape(fake, case):
    if case.setup:
        case.setup(fake)
    with pytest.raises(exceptions.BadRequest) as refused:
        case.refused(fake)
    assert case.message in refused.value.message
    assert refused.value.code == 400
    assert [e["reason"] for e in refused.value.errors] == [case.reason]
    assert refused.value.errors[0]["domain"] == "global"
    case.accepted(fake)  # the same request made right goes through


# -- the console sends what Google accepts ----------------------------------------------------------


def test_instances_take_disk_type_urls_and_templates_take_names(fake, alpha, alice):
    prefix = built(alpha, alice, gce_spec(nodes=2))
    controller = fake.resources[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{prefix}-ctl"]
    assert controller["disks"][0]["initializeParams"]["diskType"] == f"zones/{ZONE}/diskTypes/pd-ssd"
    login = fake.resources[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{prefix}-login-0"]
    assert login["disks"][0]["initializeParams"]["diskType"] == f"zones/{ZONE}/diskTypes/pd-balanced"
    assert template_of(fake, prefix)["properties"]["disks"][0]["initializeParams"]["diskType"] == "hyperdisk-balanced"


def test_gpu_machine_types_terminate_on_maintenance_without_an_accelerator_count(fake, alpha, alice):
    """Accelerator-optimized types carry their GPUs: the spec's accelerator_count is optional."""
    spec = build_spec("a3-mega", display_name="mega", zone=ZONE, nodes=2, backend="gce")
    spec["node_pools"][1]["machine_spec"] = {"machine_type": "a3-megagpu-8g"}
    prefix = built(alpha, alice, spec, name="mega")
    properties = template_of(fake, prefix, "a3mega")["properties"]
    assert properties["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert properties["resourcePolicies"] == [f"{prefix}-place-a3mega"]
    controller = fake.resources[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{prefix}-ctl"]
    items = {i["key"]: i["value"] for i in controller["metadata"]["items"]}
    assert "Gres=gpu:8" in items["slurm-conf"] and "Name=gpu File=/dev/nvidia[0-7]" in items["slurm-gres-conf"]


def test_a_pool_built_with_compact_placement_cannot_grow_past_what_its_policy_holds(fake, alpha, alice):
    """Its template names the policy and its VMs are in it: the 1,501st VM would be refused by Compute
    (the fake's rule above), so the update is refused first, naming the field, and changes nothing."""
    import copy

    from clusters.spec import SpecError

    spec = build_spec("a3-mega", display_name="mega", zone=ZONE, nodes=2, backend="gce")
    built(alpha, alice, spec, name="mega")
    cluster = Cluster.objects.get()
    operations, nodes = cluster.operations.count(), cluster.nodes.count()
    for count in (1501, 2000):
        grown = copy.deepcopy(cluster.spec)
        grown["node_pools"][1]["scaling_spec"] = {"min_node_count": count, "max_node_count": count}
        with pytest.raises(SpecError) as refused:
            services.update_cluster(cluster=cluster, spec=grown)
        assert refused.value.errors == {
            "node_pools[1].scaling_spec.min_node_count": [
                "pool 'a3mega' was built with a compact placement policy, which holds at most 1,500 VMs: keep it "
                "at 1,500 or fewer, or create a cluster with the larger pool (it gets no compact placement)"
            ]
        }
    cluster.refresh_from_db()
    assert cluster.spec["node_pools"][1]["scaling_spec"]["min_node_count"] == 2
    assert (cluster.operations.count(), cluster.nodes.count()) == (operations, nodes)


def test_spot_cpu_pools_terminate_and_do_not_restart(fake, alpha, alice):
    spec = build_spec("cpu", display_name="spot", zone=ZONE, nodes=2, backend="gce", provisioning_model="SPOT")
    prefix = built(alpha, alice, spec, name="spot")
    pool = spec["node_pools"][1]["id"]
    scheduling = template_of(fake, prefix, pool)["properties"]["scheduling"]
    assert scheduling["provisioningModel"] == "SPOT"
    assert scheduling["onHostMaintenance"] == "TERMINATE"
    assert scheduling.get("automaticRestart") is False
    assert scheduling["instanceTerminationAction"] == "DELETE"


def reservation_spec(values, machine="a3-ultra"):
    spec = build_spec(machine, display_name="resv", zone=ZONE, nodes=2, backend="gce",
                      provisioning_model="RESERVATION", reservation="unused")  # fmt: skip
    spec["node_pools"][1]["machine_spec"]["reservation_affinity"]["values"] = values
    return spec


def test_a_reserved_a3_ultra_pool_is_reservation_bound_on_its_reservations_placement(fake, alpha, alice):
    """Dana's team holds a calendar-mode reservation of A3 Ultra nodes with its own dense placement; the
    service's JSON names it by its full path."""
    setup_placed_reservation(fake)
    spec = reservation_spec([f"projects/{PROJECT}/zones/{ZONE}/reservations/dense"])
    prefix = built(alpha, alice, spec, name="resv")
    properties = template_of(fake, prefix)["properties"]
    assert properties["scheduling"]["provisioningModel"] == "RESERVATION_BOUND"
    assert properties["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert properties["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["dense"],
    }
    assert properties["resourcePolicies"] == [f"projects/{PROJECT}/regions/us-central1/resourcePolicies/their-place"]
    assert not [k for k in fake.resources if "/resourcePolicies/" in k]  # no placement policy of our own


def test_a_reservation_shared_from_another_project_is_named_with_its_project(fake, alpha, alice):
    spec = reservation_spec(["projects/capacity-host/zones/us-central1-b/reservations/shared-h100"], "a3-mega")
    prefix = built(alpha, alice, spec, name="resv")
    properties = template_of(fake, prefix, "a3mega")["properties"]
    assert properties["reservationAffinity"]["values"] == ["projects/capacity-host/reservations/shared-h100"]
    assert properties["scheduling"]["provisioningModel"] == "STANDARD"  # A3 Mega reserves as standard VMs


def test_a_rate_limited_call_is_retried_not_failed(fake, alpha, alice, settings):
    operation = create(alpha, alice, gce_spec(nodes=2))
    fake.inject("POST", r"/global/firewalls$", http_status=403, code="rateLimitExceeded",
                message="Quota exceeded for quota metric 'Queries' and limit 'Queries per minute'")  # fmt: skip
    with pytest.raises(TransientBackendError, match="rate limit"):
        engine.run(operation.pk)
    operation = run_task(operation, settings, retries=3)
    assert operation.status == "SUCCEEDED", operation.error
    assert isinstance(errors.map_message("rateLimitExceeded", "Quota exceeded for quota metric", "x", 403),
                      TransientBackendError)  # fmt: skip


def test_slurm_conf_for_ten_thousand_nodes_fits_a_metadata_value(fake, alpha, alice):
    """MAX_POOL_NODES is 10,000: its slurm.conf goes into one 256 KB metadata value."""
    from clusters.backends.gce import slurm_conf
    from clusters.backends.gce.cloud import Cloud

    operation = create(alpha, alice, gce_spec(nodes=2))
    cluster = operation.cluster
    pool = cluster.node_pools.get(pool_id="a3ultra")
    Node.objects.bulk_create(
        [Node(cluster=cluster, node_pool=pool, name=f"a3ultra-{i}", index=i) for i in range(2, 10_000)], batch_size=2000
    )
    cloud = Cloud(get_backend("gce"), cluster)
    conf = slurm_conf.render(cloud)
    prefix = names("alpha", "ultra").prefix
    assert f"NodeName=a3ultra-[0-9999] NodeHostname={prefix}-a3ultra-[0-9999] CPUs=224" in conf
    assert len(conf.encode()) < fake_rules.METADATA_VALUE_BYTES / 10
    assert "Nodes=a3ultra-[0-9999]" in conf


def test_the_fake_hands_every_instance_its_own_nics(fake, alpha, alice):
    prefix = built(alpha, alice, gce_spec(nodes=3))
    addresses = {
        fake.resources[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{prefix}-a3ultra-{i}"][
            "networkInterfaces"][0]["networkIP"]
        for i in range(3)
    }  # fmt: skip
    assert len(addresses) == 3
    assert "networkIP" not in template_of(fake, prefix)["properties"]["networkInterfaces"][0]


def test_delete_goes_in_dependency_order_past_the_strict_fake(fake, alpha, alice):
    built(alpha, alice, gce_spec(nodes=2))
    operation = services.delete_cluster(cluster=Cluster.objects.get(), user=alice)
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "SUCCEEDED", operation.error
    left = [k for k in fake.resources if k.startswith("/compute/") and "/reservations/" not in k]
    assert left == []


def test_operations_that_take_time_are_waited_for_and_their_errors_read_when_done(fake, alpha, alice, settings):
    """Every fake operation starts PENDING (operation_steps): an error shows only once it is DONE."""
    assert fake.operation_steps == 2
    operation = create(alpha, alice, gce_spec(nodes=2))
    fake.inject("POST", r"/instances/bulkInsert$", code="QUOTA_EXCEEDED",
                message="Quota 'NVIDIA_H200_GPUS' exceeded.  Limit: 8.0 in region us-central1.")  # fmt: skip
    operation = run_task(operation, settings, retries=3)
    assert operation.status == "FAILED" and "quota NVIDIA_H200_GPUS exceeded" in operation.error
    assert fake.calls["POST wait"] > 0
    sent = [op for op in fake.operations.values() if op.get("operationType") == "bulkInsert"]
    assert sent and all(op["status"] == "DONE" for op in sent)


def test_a_pool_larger_than_a_bulk_insert_is_created_in_chunks(fake, alpha, alice, monkeypatch):
    """bulkInsert takes up to 5,000 VMs a call and a pool up to 10,000: here, 3 a call and 7 nodes."""
    from clusters.backends.gce import instances

    monkeypatch.setattr(instances, "BULK_INSERT_MAX", 3)
    monkeypatch.setattr(fake_rules, "BULK_INSERT_MAX", 3)
    built(alpha, alice, gce_spec(nodes=7))
    assert fake.calls["POST bulkInsert"] == 3
    assert len([k for k in fake.instances() if "-a3ultra-" in k]) == 7


# -- storage and private services access ----------------------------------------------------------


def storage_spec(tier):
    spec = gce_spec(nodes=2)
    spec["console"]["storage"]["filestore_home"] = {"tier": tier, "capacity_gb": 1024}
    return spec


def test_regional_filestore_lives_in_the_region_and_zonal_in_the_zone(fake, alpha, alice):
    prefix = built(alpha, alice, storage_spec("REGIONAL"), name="reg")
    assert f"file:projects/{PROJECT}/locations/us-central1/instances/{prefix}-home" in fake.resources
    prefix = built(alpha, alice, storage_spec("ZONAL"), name="zon")
    assert f"file:projects/{PROJECT}/locations/{ZONE}/instances/{prefix}-home" in fake.resources


def test_private_services_access_names_the_project_by_number_and_goes_after_storage(fake, alpha, alice):
    """Service Networking takes projects/NUMBER/...; it refuses to delete a peering Filestore still uses,
    so the delete waits until Filestore is gone first."""
    from .fake_compute import project_number

    prefix = built(alpha, alice, storage_spec("ZONAL"))
    number = project_number(PROJECT)
    peering = f"servicenetworking/projects/{number}/global/networks/{prefix}-net"
    assert peering in fake.resources
    assert fake.resources[peering]["reservedPeeringRanges"] == [f"{prefix}-psa"]
    assert Cluster.objects.get().backend_state["project_numbers"] == {PROJECT: number}
    operation = services.delete_cluster(cluster=Cluster.objects.get(), user=alice)
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "SUCCEEDED", operation.error
    assert peering not in fake.resources and not [k for k in fake.resources if k.startswith("file:")]


def test_users_log_in_with_os_login_through_iap_as_the_cluster_page_says(fake, alpha, alice, client):
    prefix = built(alpha, alice, gce_spec(nodes=2))
    for name in ("ctl", "login-0"):
        items = fake.resources[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{prefix}-{name}"]["metadata"]
        assert {"key": "enable-oslogin", "value": "TRUE"} in items["items"]
    assert {"key": "enable-oslogin", "value": "TRUE"} in template_of(fake, prefix)["properties"]["metadata"]["items"]
    client.force_login(alice)
    page = client.get("/clusters/alpha/ultra/").content.decode()
    command = f"gcloud compute ssh {prefix}-login-0 --zone {ZONE} --project {PROJECT} --tunnel-through-iap"
    assert f'<code id="login-command">{command}</code>' in page


def test_cloud_nat_gives_nodes_the_internet_when_asked_and_goes_before_its_network(fake, alpha, alice):
    """Nodes have no external address: without a baked image they need Cloud NAT to reach package mirrors."""
    spec = gce_spec(nodes=2)
    spec["console"]["network"]["cloud_nat"] = True
    prefix = built(alpha, alice, spec)
    router = fake.resources[f"/compute/v1/projects/{PROJECT}/regions/us-central1/routers/{prefix}-router"]
    assert router["network"] == f"projects/{PROJECT}/global/networks/{prefix}-net"
    assert router["nats"] == [{"name": f"{prefix}-nat", "natIpAllocateOption": "AUTO_ONLY",
                               "sourceSubnetworkIpRangesToNat": "ALL_SUBNETWORKS_ALL_IP_RANGES"}]  # fmt: skip
    operation = services.delete_cluster(cluster=Cluster.objects.get(), user=alice)
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "SUCCEEDED", operation.error
    assert not [k for k in fake.resources if "/routers/" in k or "/networks/" in k]
    assert fake.calls["POST routers"] == 1 and fake.calls["DELETE routers"] == 1


def test_cloud_nat_is_only_for_a_network_the_console_creates(alice_api):
    spec = gce_spec(nodes=2)
    spec["console"]["network"] = {"create": False, "cloud_nat": True}
    spec["network"] = {"network": "shared-vpc", "subnetwork": "shared-subnet"}
    response = alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "nat", "spec": spec}, format="json")
    assert response.status_code == 400
    assert "a network it creates" in str(response.json())


def test_a_node_image_is_baked_through_the_compute_api(fake, alpha):
    """`manage.py gce_image build`: a builder VM runs bake.sh, is stopped, its disk becomes the family's newest
    image, and it is deleted; nodes then boot the family without the internet."""
    import io
    import subprocess

    from django.core.management import call_command

    out = io.StringIO()
    call_command("gce_image", "build", "--project", "alpha", "--zone", ZONE, stdout=out)
    images = [r for k, r in fake.resources.items() if "/global/images/" in k]
    assert len(images) == 1 and images[0]["family"] == "tcc-node"
    assert images[0]["sourceDisk"].startswith(f"projects/{PROJECT}/zones/{ZONE}/disks/tcc-node-builder-")
    assert fake.calls["POST stop"] == 1  # stopped before the image (the strict fake refuses otherwise)
    assert not fake.instances()  # the builder is gone
    assert f"GCE_IMAGE=projects/{PROJECT}/global/images/family/tcc-node" in out.getvalue()
    from clusters.backends.gce.image import bake_script

    script = bake_script(gpu=True, family="tcc-gpu-node", stamp="x")
    assert "slurmd" in script and "datacenter-gpu-manager" in script and "@" not in script
    # The GPU networks' NCCL plugins and TCPXO's daemon are baked: nodes have no route to pull them.
    for image in ("gpudirect-gib/nccl-plugin-gib:v1.1.0", "gpudirect-tcpxo/nccl-plugin-gpudirecttcpx-dev:v1.0.8-1",
                  "gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.14"):  # fmt: skip
        assert f'="us-docker.pkg.dev/gce-ai-infra/{image}"' in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_an_arm64_gpu_image_is_baked_on_an_arm_builder_from_ubuntus_arm64_accelerator_image(fake, alpha):
    """For A4X: the builder is a C4A (Arm, Hyperdisk only: the fake refuses an x86 image or a Persistent Disk
    on it, as Compute does) booting Ubuntu's Arm64 accelerator image; the family is tcc-gpu-node-arm64."""
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    from clusters.backends.gce.image import bake_script

    builders = []
    original = fake._compute

    def watching(method, path, query, body, injection):
        if method == "POST" and path.endswith("/instances") and body:
            builders.append(body)
        return original(method, path, query, body, injection)

    fake._compute = watching
    out = io.StringIO()
    call_command("gce_image", "build", "--project", "alpha", "--zone", ZONE, "--gpu", "--arm64", stdout=out)
    (builder,) = builders
    assert builder["machineType"].endswith("/machineTypes/c4a-highcpu-16")
    assert builder["disks"][0]["initializeParams"]["sourceImage"] == ARM_GPU_IMAGE
    images = [r for k, r in fake.resources.items() if "/global/images/" in k]
    assert [(image["family"], image["architecture"]) for image in images] == [("tcc-gpu-node-arm64", "ARM64")]
    assert f"GCE_GPU_ARM64_IMAGE=projects/{PROJECT}/global/images/family/tcc-gpu-node-arm64" in out.getvalue()
    script = bake_script(gpu=True, family="tcc-gpu-node-arm64", stamp="x")
    assert "repo_arch=sbsa" in script  # NVIDIA's Arm64 server repository for DCGM
    # An image has its disk's architecture, whatever its family is called (the fake, as Compute).
    call_command("gce_image", "build", "--project", "alpha", "--zone", ZONE, "--gpu", "--arm64", "--family", "gb")
    assert fake_rules.image_architecture(fake.resources, f"projects/{PROJECT}/global/images/family/gb") == "ARM64"
    with pytest.raises(CommandError, match="add --gpu"):
        call_command("gce_image", "build", "--project", "alpha", "--zone", ZONE, "--arm64")


def test_a_bake_that_fails_says_why_and_leaves_no_builder(fake, alpha):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    original = fake._compute

    def failing(method, path, query, body, injection):
        status, payload = original(method, path, query, body, injection)
        if path.endswith("/serialPort"):
            payload["contents"] = "startup-script: tcc-startup: FAILED: installing gcsfuse\n"
        return status, payload

    fake._compute = failing
    with pytest.raises(CommandError, match="FAILED: installing gcsfuse"):
        call_command("gce_image", "build", "--project", "alpha", "--zone", ZONE)
    assert not fake.instances() and not [k for k in fake.resources if "/global/images/" in k]


@pytest.mark.parametrize(("machine", "nics", "gpus"), [("a3-highgpu-8g", 5, 8), ("a3-edgegpu-8g", 5, 8),
                                                        ("a3-highgpu-1g", 1, 1)])  # fmt: skip
def test_a3_high_and_edge_get_their_gpus_and_tcpx_nics(fake, alpha, alice, machine, nics, gpus):
    """A3 High (1, 2, 4 or 8 H100s) and A3 Edge join the catalog: the 8-GPU shapes get GPUDirect-TCPX's 4 GPU
    NICs, one VPC each, outside Docker's 172.16.0.0/12."""
    spec = build_spec("a3-mega", display_name="high", zone=ZONE, nodes=2, backend="gce")
    spec["node_pools"][1]["machine_spec"] = {"machine_type": machine, "accelerator_type": "NVIDIA_H100_80GB"}
    prefix = built(alpha, alice, spec, name="high")
    properties = template_of(fake, prefix, "a3mega")["properties"]
    assert len(properties["networkInterfaces"]) == nics
    assert properties["scheduling"]["onHostMaintenance"] == "TERMINATE"
    controller = fake.resources[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{prefix}-ctl"]
    conf = {i["key"]: i["value"] for i in controller["metadata"]["items"]}["slurm-conf"]
    assert f"Gres=gpu:{gpus}" in conf


# -- file systems the spec names -------------------------------------------------------------------

TEAM_HOME = f"projects/{PROJECT}/locations/{ZONE}/instances/team-home"
SCRATCH = f"projects/{PROJECT}/locations/{ZONE}/instances/scratch"


def existing_storage_spec():
    """Dana's team keeps /home on a Filestore and datasets on a Managed Lustre that outlive clusters."""
    spec = gce_spec(nodes=2)
    spec["console"]["storage"].pop("filestore_home")
    spec["orchestrator_spec"]["slurm_spec"]["home_directory_storage"] = TEAM_HOME
    spec["node_pools"][1]["lustres"] = [SCRATCH]
    return spec


def test_file_systems_the_spec_names_are_mounted_where_it_says(fake, alpha, alice):
    fake.resources[f"file:{TEAM_HOME}"] = {"name": TEAM_HOME, "networks": [{"ipAddresses": ["10.9.0.2"]}],
                                           "fileShares": [{"name": "home", "capacityGb": "2048"}]}  # fmt: skip
    fake.resources[f"lustre:{SCRATCH}"] = {"name": SCRATCH, "mountPoint": "10.9.0.3@tcp:/lustrefs"}
    prefix = built(alpha, alice, existing_storage_spec())
    script = {i["key"]: i["value"] for i in template_of(fake, prefix)["properties"]["metadata"]["items"]}
    assert (
        "EXISTING_MOUNTS='nfs 10.9.0.2:/home /home;lustre 10.9.0.3@tcp:/lustrefs /mnt/scratch'"
        in (script["startup-script"])
    )
    login = fake.resources[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{prefix}-login-0"]
    login_script = {i["key"]: i["value"] for i in login["metadata"]["items"]}["startup-script"]
    assert "EXISTING_MOUNTS='nfs 10.9.0.2:/home /home'" in login_script  # the pool's Lustre is its nodes' only
    assert not [k for k in fake.resources if k.startswith("file:") and k != f"file:{TEAM_HOME}"]  # none created
    engine.run(services.delete_cluster(cluster=Cluster.objects.get(), user=alice).pk)
    assert f"file:{TEAM_HOME}" in fake.resources and f"lustre:{SCRATCH}" in fake.resources  # not the cluster's


def test_a_file_system_the_spec_names_that_does_not_exist_stops_the_create_naming_the_field(fake, alpha, alice):
    fake.resources[f"file:{TEAM_HOME}"] = {"name": TEAM_HOME, "networks": [{"ipAddresses": ["10.9.0.2"]}],
                                           "fileShares": [{"name": "home"}]}  # fmt: skip
    operation = create(alpha, alice, existing_storage_spec())
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "FAILED"
    assert operation.error == f"node_pools[1].lustres[0]: no Managed Lustre instance {SCRATCH}"


def test_home_named_and_created_at_once_is_refused(alice_api):
    spec = existing_storage_spec()
    spec["console"]["storage"]["filestore_home"] = {"tier": "ZONAL", "capacity_gb": 1024}
    spec["node_pools"][1]["filestores"] = ["team-home"]
    response = alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "both", "spec": spec}, format="json")
    assert response.status_code == 400
    errors = response.json()["spec"]
    assert "not both" in str(errors["orchestrator_spec.slurm_spec.home_directory_storage"])
    assert "must be a full instance name" in str(errors["node_pools[1].filestores[0]"])


# -- the console reaches its clusters -------------------------------------------------------------


def test_only_the_consoles_workers_reach_the_controllers_doors(fake, alpha, alice, settings):
    settings.GCE_REACH_CLUSTERS = True
    settings.GCE_CONSOLE_RANGES = []
    operation = create(alpha, alice, gce_spec(nodes=2))
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "FAILED" and "GCE_CONSOLE_RANGES is empty" in operation.error
    Cluster.objects.all().delete()

    # With the workers' range but no network of theirs to peer with, a new VPC would be out of their reach.
    settings.GCE_CONSOLE_RANGES = ["10.200.0.0/24"]
    operation = create(alpha, alice, gce_spec(nodes=2))
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "FAILED" and "no route to this cluster's new VPC" in operation.error
    assert not fake.instances()
    Cluster.objects.all().delete()

    settings.GCE_CONSOLE_NETWORK = "projects/console-host/global/networks/console"
    fake.resources["/compute/v1/projects/console-host/global/networks/console"] = {"name": "console"}
    settings.GCE_REACH_CLUSTERS = False  # provisioning only here: nothing in the fake answers on a controller
    operation = create(alpha, alice, gce_spec(nodes=2))
    settings.GCE_REACH_CLUSTERS = True
    steps = [s for s in get_backend("gce").apply_steps(operation.cluster) if "Wait" not in s.name]
    steps = [s for s in steps if not s.name.startswith(("Reconfigure", "Hold"))]
    for step in steps:
        step.run(None)
    prefix = names("alpha", "ultra").prefix
    rule = fake.resources[f"/compute/v1/projects/{PROJECT}/global/firewalls/{prefix}-console"]
    assert rule["sourceRanges"] == ["10.200.0.0/24"] and rule["targetTags"] == [f"{prefix}-controller"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["6820", "6821"]}]
    cluster_net = fake.resources[f"/compute/v1/projects/{PROJECT}/global/networks/{prefix}-net"]
    console_net = fake.resources["/compute/v1/projects/console-host/global/networks/console"]
    assert [p["network"] for p in cluster_net["peerings"]] == ["projects/console-host/global/networks/console"]
    assert [p["network"] for p in console_net["peerings"]] == [f"projects/{PROJECT}/global/networks/{prefix}-net"]
    assert [p["state"] for p in cluster_net["peerings"] + console_net["peerings"]] == ["ACTIVE", "ACTIVE"]
    for step in get_backend("gce").delete_steps(Cluster.objects.get()):
        step.run(None)
    assert (
        console_net["peerings"] == []
        and f"/compute/v1/projects/{PROJECT}/global/firewalls/{prefix}-console" not in fake.resources
    )


def test_a_console_outside_google_cloud_reaches_the_controller_at_its_external_address_only(
    fake, alpha, alice, alice_api, settings
):
    """GCE_CONTROLLER_ACCESS=external: a new VPC needs no console network to peer with; the controller gets
    an external address (one ONE_TO_ONE_NAT access config; compute nodes none), the console keeps it, only the
    console's ranges are admitted to the controller's two doors, and nothing admits the router to the compute
    nodes: an endpoint on the cluster is refused saying why."""
    settings.GCE_CONTROLLER_ACCESS = "external"
    settings.GCE_CONSOLE_NETWORK = ""
    settings.GCE_REACH_CLUSTERS = True
    # The whole internet, or what is not a range, is refused before anything is made.
    for ranges, why in ((["0.0.0.0/0"], "admits the whole internet"), (["console"], "not an address range")):
        settings.GCE_CONSOLE_RANGES = ranges
        checks = {f.check: f for f in services.preflight(project=alpha, spec=gce_spec(nodes=2))}
        assert checks["console reach"].status == "fail" and why in checks["console reach"].detail
        operation = create(alpha, alice, gce_spec(nodes=2))
        engine.run(operation.pk)
        operation.refresh_from_db()
        assert operation.status == "FAILED" and why in operation.error and not fake.instances()
        Cluster.objects.all().delete()
    settings.GCE_CONSOLE_RANGES = ["203.0.113.0/28"]  # the console's public egress addresses
    checks = {f.check: f for f in services.preflight(project=alpha, spec=gce_spec(nodes=2))}
    assert checks["console reach"].status == "ok" and "external address" in checks["console reach"].detail
    settings.GCE_REACH_CLUSTERS = False  # provisioning only here: nothing in the fake answers on a controller
    operation = create(alpha, alice, gce_spec(nodes=2))
    settings.GCE_REACH_CLUSTERS = True
    steps = [s for s in get_backend("gce").apply_steps(operation.cluster) if "Wait" not in s.name]
    for step in [s for s in steps if not s.name.startswith(("Reconfigure", "Hold", "Peer"))]:
        step.run(None)
    assert not any(s.name.startswith("Peer") for s in steps)
    prefix = names("alpha", "ultra").prefix
    instances = fake.instances()
    controller = instances[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{prefix}-ctl"]
    [config] = controller["networkInterfaces"][0]["accessConfigs"]
    assert config["type"] == "ONE_TO_ONE_NAT" and config["natIP"].startswith("34.118.")
    compute = [i for i in instances.values() if i["labels"]["tcc-role"] == "compute"]
    assert compute and not any(i["networkInterfaces"][0].get("accessConfigs") for i in compute)
    template = template_of(fake, prefix)
    assert not template["properties"]["networkInterfaces"][0].get("accessConfigs")
    firewalls = {key.rsplit("/", 1)[1]: rule for key, rule in fake.resources.items() if "/firewalls/" in key}
    assert firewalls[f"{prefix}-console"]["sourceRanges"] == ["203.0.113.0/28"]
    assert firewalls[f"{prefix}-console"]["targetTags"] == [f"{prefix}-controller"]
    assert f"{prefix}-serving" not in firewalls

    from clusters.backends.gce.instances import controller_address

    found = client(fake, compute_v1.InstancesClient).get(project=PROJECT, zone=ZONE, instance=f"{prefix}-ctl")
    assert controller_address(found) == config["natIP"]
    settings.GCE_CONTROLLER_ACCESS = "internal"
    assert controller_address(found) == controller["networkInterfaces"][0]["networkIP"]
    settings.GCE_CONTROLLER_ACCESS = "external"

    cluster = Cluster.objects.get()
    Cluster.objects.filter(pk=cluster.pk).update(status="READY")
    response = alice_api.post("/api/v1/projects/alpha/endpoints/", {"name": "chat", "cluster": "ultra",
                              "model": "m", "version": 1}, format="json")  # fmt: skip
    assert response.status_code == 400
    assert "cannot reach replicas on the compute nodes" in str(response.json()["cluster"])


def read_secret(fake, vm, key):
    """What a VM's job gets from Secret Manager with the token the VM's metadata server hands out."""
    import requests

    return requests.get(f"{fake.endpoint}/sm/v1/{key}/versions/latest:access",
                        headers={"Authorization": f"Bearer fake-token-{vm}"}, timeout=5)  # fmt: skip


def account_of(cluster_name):
    return f"{names('alpha', cluster_name).service_account_id}@{PROJECT}.iam.gserviceaccount.com"


def test_one_clusters_nodes_cannot_read_another_clusters_keys(fake, alpha, alice, settings):
    """The attack: a job on cluster B takes its VM's token and reads cluster A's munge key (then mints
    tokens, joins A's Slurm as root). With every VM on the project's default account both clusters' secrets
    granted that one account, and B's VM read A's key (200 before). Each cluster now runs as its own
    account, granted on its own four secrets only: 403, Secret Manager's PERMISSION_DENIED."""
    first = built(alpha, alice, gce_spec(nodes=2))
    second = built(alpha, alice, gce_spec(nodes=1), name="other")
    for prefix, name in ((first, "ultra"), (second, "other")):
        for kind in ("munge", "jwt", "agent", "tls"):
            bindings = fake.iam[f"projects/{PROJECT}/secrets/{prefix}-{kind}-key"]["bindings"]
            assert bindings == [{"role": "roles/secretmanager.secretAccessor",
                                 "members": [f"serviceAccount:{account_of(name)}"]}]  # fmt: skip
    secret = f"projects/{PROJECT}/secrets/{first}-munge-key"
    assert read_secret(fake, f"{first}-a3ultra-0", secret).status_code == 200
    refused = read_secret(fake, f"{second}-a3ultra-0", secret)
    assert refused.status_code == 403 and refused.json()["error"]["status"] == "PERMISSION_DENIED"


def test_each_cluster_has_its_own_account_with_only_its_roles_and_deletes_it(fake, alpha, alice):
    """The account is made with the cluster (accountId within IAM's 6-30 characters), the VMs run as it, it
    gets the project's log and metric writer roles and nothing else project-wide, and delete takes its
    roles off the project, off the buckets it mounted (which stay), then the account."""
    fake.iam["project:tcc-test"] = {"bindings": [{"role": "roles/owner", "members": ["user:ops@example.com"]}],
                                    "etag": "BwAAAA==", "version": 1}  # fmt: skip
    prefix = built(alpha, alice, gce_spec(nodes=2))
    email = account_of("ultra")
    assert f"iam:{email}" in fake.resources and 6 <= len(email.split("@")[0]) <= 30
    assert template_of(fake, prefix)["properties"]["serviceAccounts"][0]["email"] == email
    controller = fake.resources[f"/compute/v1/projects/{PROJECT}/zones/us-central1-b/instances/{prefix}-ctl"]
    assert controller["serviceAccounts"][0]["email"] == email
    policy = fake.iam["project:tcc-test"]["bindings"]
    who = f"serviceAccount:{email}"
    assert sorted(b["role"] for b in policy if who in b["members"]) == [
        "roles/logging.logWriter", "roles/monitoring.metricWriter"]  # fmt: skip
    assert {"role": "roles/owner", "members": ["user:ops@example.com"]} in policy  # others' bindings kept
    buckets = [k for k in fake.iam if k.startswith("gcs:")]
    assert buckets and all(any(who in b["members"] for b in fake.iam[k]["bindings"]) for k in buckets)

    engine.run(services.delete_cluster(cluster=Cluster.objects.get(), user=alice).pk)
    assert f"iam:{email}" not in fake.resources
    assert fake.iam["project:tcc-test"]["bindings"] == [{"role": "roles/owner", "members": ["user:ops@example.com"]}]
    assert all(k in fake.resources for k in buckets)
    assert not [k for k in buckets if any(who in b["members"] for b in fake.iam[k]["bindings"])]


def test_a_new_account_iam_does_not_see_yet_is_waited_for(fake, alpha, alice, settings):
    """IAM shows a new account only after a while (up to a minute and more): reading it back, naming it in a
    policy and starting a VM as it are refused until then. The create waits, it does not fail."""
    fake.iam_propagation_seconds = 1.5
    settings.GCE_POLL_INTERVAL = 0.1
    built(alpha, alice, gce_spec(nodes=1))
    assert f"iam:{account_of('ultra')}" in fake.resources


def test_an_account_of_that_name_the_console_did_not_make_stops_the_create(fake, alpha, alice):
    fake.add_service_account(account_of("ultra"))
    operation = create(alpha, alice, gce_spec(nodes=1))
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "FAILED" and "already exists and was not created by this cluster" in operation.error


def test_a_named_account_is_used_as_it_is_and_gets_no_project_roles(fake, alpha, alice):
    spec = gce_spec(nodes=1)
    spec["runtime_spec"] = {"service_account": NODES_ACCOUNT}
    fake.add_service_account(NODES_ACCOUNT)
    prefix = built(alpha, alice, spec)
    assert template_of(fake, prefix)["properties"]["serviceAccounts"][0]["email"] == NODES_ACCOUNT
    assert not (fake.iam.get("project:tcc-test") or {}).get("bindings")
    assert fake.iam[f"projects/{PROJECT}/secrets/{prefix}-munge-key"]["bindings"][0]["members"] == [
        f"serviceAccount:{NODES_ACCOUNT}"]  # fmt: skip
    engine.run(services.delete_cluster(cluster=Cluster.objects.get(), user=alice).pk)
    assert f"iam:{NODES_ACCOUNT}" in fake.resources  # the user's: kept


def test_buckets_are_made_with_uniform_access_or_checked_and_the_nodes_may_use_them(fake, alpha, alice):
    """The A3 Ultra architecture mounts three buckets: the console makes the missing ones in the region with
    uniform bucket-level access, grants the nodes objectUser on each, mounts them with gcsfuse's real flags,
    and keeps them when the cluster goes (checkpoints outlive it)."""
    fake.resources["gcs:team-datasets"] = {"name": "team-datasets", "location": "us-central1"}  # theirs already
    spec = gce_spec(nodes=2)
    buckets = spec["console"]["storage"]["gcs_buckets"]
    buckets.append({"bucket": "team-datasets", "mount_point": "/datasets", "mount_options": ["implicit-dirs"]})
    prefix = built(alpha, alice, spec)
    made = [k for k, r in fake.resources.items() if k.startswith("gcs:") and r.get("labels", {}).get("tcc-cluster")]
    assert len(made) == len(buckets) - 1
    for key in made:
        bucket = fake.resources[key]
        assert bucket["iamConfiguration"] == {"uniformBucketLevelAccess": {"enabled": True}}
        assert bucket["location"] == "us-central1"
    nodes = f"serviceAccount:{account_of('ultra')}"
    for bucket in buckets:
        assert {"role": "roles/storage.objectUser", "members": [nodes]} in fake.iam[f"gcs:{bucket['bucket']}"][
            "bindings"
        ]
    script = {i["key"]: i["value"] for i in template_of(fake, prefix)["properties"]["metadata"]["items"]}[
        "startup-script"
    ]
    assert "team-datasets /datasets --implicit-dirs -o allow_other" in script
    assert "--metadata-cache-ttl-secs=-1" in script and "--file-cache-max-size-mb=-1" in script
    engine.run(services.delete_cluster(cluster=Cluster.objects.get(), user=alice).pk)
    assert all(key in fake.resources for key in made)


def test_a_bucket_name_another_project_holds_stops_the_create_saying_so(fake, alpha, alice):
    spec = gce_spec(nodes=2)
    taken = spec["console"]["storage"]["gcs_buckets"][0]["bucket"]
    fake.resources[f"gcs:{taken}"] = {"name": taken, "foreign": True}
    operation = create(alpha, alice, spec)
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "FAILED" and f"bucket {taken} exists, but the console's credentials cannot read it" in (
        operation.error
    )


def test_a_gpu_pool_on_an_existing_vpc_is_refused_naming_the_fabric_it_needs(alice_api):
    """An A3 Ultra pool on an existing VPC once got one gVNIC: no MRDMA NICs, no RoCE network."""
    spec = gce_spec(nodes=2)
    spec["console"]["network"] = {"create": False}
    spec["console"]["storage"] = {}
    spec["network"] = {"network": "projects/tcc-test/global/networks/team-vpc", "subnetwork": "team-subnet"}
    response = alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "ultra", "spec": spec}, format="json")
    assert response.status_code == 400
    message = response.json()["spec"]["node_pools[1].machine_spec.machine_type"][0]
    assert "an RDMA (RoCE) VPC with 8 subnets" in message and "console.network.create" in message


def test_the_regions_quota_refuses_what_exceeds_it_and_the_operation_names_it(fake, alpha, alice, settings):
    """Quotas set per test are enforced on every create, counting what the region already runs."""
    fake.quotas[("us-central1", "NVIDIA_H200_GPUS")] = 24  # room for 3 A3 Ultra nodes of 8 GPUs
    operation = create(alpha, alice, gce_spec(nodes=4))
    operation = run_task(operation, settings, retries=3)
    assert operation.status == "FAILED"
    assert "quota NVIDIA_H200_GPUS exceeded in region us-central1: the limit is 24" in operation.error
    assert not [k for k in fake.instances() if "-a3ultra-" in k]  # bulkInsert checks quota up front
    Cluster.objects.all().delete()
    fake.quotas[("us-central1", "NVIDIA_H200_GPUS")] = 32
    built(alpha, alice, gce_spec(nodes=4), name="fits")


def test_a_stockout_set_for_a_machine_type_holds_its_pool_until_it_clears(fake, alpha, alice):
    from django.utils import timezone

    from clusters.models import Operation
    from clusters.work import CapacityError

    fake.stockouts.add((ZONE, "a3-ultragpu-8g"))
    operation = create(alpha, alice, gce_spec(nodes=2))
    with pytest.raises(CapacityError, match="ZONE_RESOURCE_POOL_EXHAUSTED"):
        engine.run(operation.pk)
    fake.stockouts.clear()
    Operation.objects.filter(pk=operation.pk).update(not_before=timezone.now())
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "SUCCEEDED", operation.error


@pytest.mark.parametrize(
    "cluster_name", ["ab", "ultra", "a-very-long-cluster-name-of-sixty-three-characters-at-the-limit", "x-" * 10]
)
def test_every_cluster_name_gives_an_account_id_iam_accepts(cluster_name):
    from .fake_compute import ACCOUNT_ID

    account_id = names("a-project", cluster_name).service_account_id
    assert 6 <= len(account_id) <= 30 and ACCOUNT_ID.match(account_id), account_id
    assert account_id != names("a-project", cluster_name + "2").service_account_id
