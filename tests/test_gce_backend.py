"""The gce backend against the fake Compute API: bulkInsert per pool, resumable runs, mapped errors,
ownership on delete, and the dry-run plan."""

import base64
import ipaddress

import pytest

from clusters import services
from clusters.backends import PermanentBackendError, TransientBackendError, get_backend
from clusters.backends.gce.names import names
from clusters.choices import ClusterStatus, OperationStatus
from clusters.models import Cluster, Operation
from clusters.operations import engine
from clusters.spec import SpecError
from clusters.spec.reference import build_spec

from .conftest import example_spec
from .gce_fixtures import built, create, gce_spec, run_task, template_of

pytestmark = pytest.mark.django_db


def test_it_creates_workers_with_one_bulk_insert_per_pool(fake, alpha, alice):
    operation = create(alpha, alice, gce_spec(nodes=64, pools=2))
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    assert fake.calls["POST bulkInsert"] == 2
    assert len(fake.instances()) == 128 + 2  # workers, controller, one login node
    prefix = names("alpha", "ultra").prefix
    worker = fake.resources[f"/compute/v1/projects/tcc-test/zones/us-central1-b/instances/{prefix}-a3ultra-63"]
    assert worker["labels"]["tcc-cluster"] == prefix
    template = fake.resources[f"/compute/v1/projects/tcc-test/global/instanceTemplates/{prefix}-tpl-a3ultra"]
    properties = template["properties"]
    assert properties["networkInterfaces"][0]["nicType"] == "GVNIC"
    assert properties["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert properties["resourcePolicies"] == [f"{prefix}-place-a3ultra"]
    network = fake.resources[f"/compute/v1/projects/tcc-test/global/networks/{prefix}-net"]
    assert network["mtu"] == 8896


def test_a_rerun_after_a_crash_creates_only_what_is_missing(fake, alpha, alice):
    operation = create(alpha, alice, gce_spec(nodes=4))
    steps = get_backend("gce").apply_steps(operation.cluster)
    storage = next(i for i, step in enumerate(steps) if step.name.startswith("Create Filestore"))
    for step in steps[: storage + 1]:  # the worker dies after the network and storage steps
        step.run(None)
    fake.reset_calls()
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    assert fake.calls["POST networks"] == fake.calls["POST subnetworks"] == fake.calls["POST firewalls"] == 0
    assert fake.calls["POST file:instances"] == 0
    assert fake.calls["POST bulkInsert"] == 1
    assert len(fake.instances()) == 4 + 2


def test_a_partial_bulk_insert_is_topped_up_not_repeated(fake, alpha, alice):
    operation = create(alpha, alice, gce_spec(nodes=4))
    fake.inject("POST", r"/instances/bulkInsert$", code="PARTIAL", message="2")
    with pytest.raises(TransientBackendError, match="2 of 4 a3ultra nodes created"):
        engine.run(operation.pk)
    assert Operation.objects.get(pk=operation.pk).status == OperationStatus.PENDING
    Operation.objects.filter(pk=operation.pk).update(not_before=None)  # the capacity wait is over
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    assert fake.calls["POST bulkInsert"] == 2
    workers = [k for k in fake.instances() if "-a3ultra-" in k]
    assert len(workers) == 4


def test_a_stockout_is_waited_out_for_hours_saying_so_then_fails(fake, alpha, alice, settings):
    """No H200s in the zone: the create waits for capacity (OPERATION_CAPACITY_WAIT_HOURS) instead of
    failing after a few quick retries, says on the operation what it waits for, and spends no attempts."""
    from datetime import timedelta

    from django.utils import timezone

    from clusters.work import CapacityError

    stockout = "The zone 'us-central1-b' does not have enough resources available to fulfill the request."
    operation = create(alpha, alice, gce_spec(nodes=2))
    fake.inject("POST", r"/instances/bulkInsert$", times=3, code="ZONE_RESOURCE_POOL_EXHAUSTED", message=stockout)
    with pytest.raises(CapacityError):
        engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.PENDING and operation.attempts == 0
    assert operation.step.startswith("Waiting for capacity (since")
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in operation.step and "gives up" in operation.step
    assert operation.not_before > timezone.now() + timedelta(seconds=250)
    engine.run(operation.pk)  # an early message (a duplicate, the stale sweep) does not try before not_before
    assert fake.calls["POST bulkInsert"] == 1 and operation.pk not in engine.stale(stale_after=0)

    Operation.objects.filter(pk=operation.pk).update(not_before=timezone.now())  # five minutes later
    with pytest.raises(CapacityError):
        engine.run(operation.pk)
    operation.refresh_from_db()
    assert fake.calls["POST bulkInsert"] == 2 and operation.attempts == 0
    cluster = Cluster.objects.get()
    assert cluster.events.filter(level="WARNING", message__startswith="Waiting for capacity").count() == 1

    hours = settings.OPERATION_CAPACITY_WAIT_HOURS
    Operation.objects.filter(pk=operation.pk).update(
        not_before=timezone.now(), waiting_since=timezone.now() - timedelta(hours=hours, minutes=1)
    )
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert "no capacity in the zone or reservation right now (ZONE_RESOURCE_POOL_EXHAUSTED)" in operation.error
    assert f"still none after {hours:g} h of waiting" in operation.error
    assert Cluster.objects.get().status == ClusterStatus.FAILED


def test_capacity_that_comes_back_ends_the_wait(fake, alpha, alice):
    from django.utils import timezone

    from clusters.work import CapacityError

    operation = create(alpha, alice, gce_spec(nodes=2))
    fake.inject("POST", r"/instances/bulkInsert$", code="ZONE_RESOURCE_POOL_EXHAUSTED", message="no room")
    with pytest.raises(CapacityError):
        engine.run(operation.pk)
    Operation.objects.filter(pk=operation.pk).update(not_before=timezone.now())
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error


def test_it_names_the_quota_that_ran_out(fake, alpha, alice, settings):
    operation = create(alpha, alice, gce_spec(nodes=2))
    fake.inject(
        "POST",
        r"/instances/bulkInsert$",
        code="QUOTA_EXCEEDED",
        message="Quota 'NVIDIA_H200_GPUS' exceeded.  Limit: 8.0 in region us-central1.",
    )
    operation = run_task(operation, settings, retries=3)
    assert operation.status == OperationStatus.FAILED
    assert operation.error == (
        "bulkInsert of 2 a3ultra nodes: quota NVIDIA_H200_GPUS exceeded in region us-central1: "
        "the limit is 8; ask for more quota or fewer nodes"
    )


def test_it_names_the_missing_permission(fake, alpha, alice, settings):
    operation = create(alpha, alice, gce_spec(nodes=2))
    fake.inject(
        "POST",
        r"/global/networks$",
        http_status=403,
        message="Required 'compute.networks.create' permission for 'projects/tcc-test/global/networks/x'",
    )
    operation = run_task(operation, settings, retries=3)
    assert operation.status == OperationStatus.FAILED
    assert "permission denied: the credentials lack compute.networks.create on projects/tcc-test" in operation.error


def test_it_reports_a_machine_type_the_zone_does_not_have(fake, alpha, alice, settings):
    operation = create(alpha, alice, gce_spec(nodes=2))
    fake.inject(
        "POST",
        r"/instanceTemplates$",
        http_status=400,
        message="Invalid value for field 'resource.properties.machineType': 'a3-ultragpu-8g'. "
        "Machine type with name 'a3-ultragpu-8g' does not exist in zone 'us-central1-b'.",
    )
    operation = run_task(operation, settings, retries=3)
    assert operation.status == OperationStatus.FAILED
    assert "invalid machine type for this zone" in operation.error


def test_delete_leaves_what_it_did_not_create(fake, alpha, alice):
    foreign = "/compute/v1/projects/tcc-test/zones/us-central1-b/instances/someone-elses-vm"
    fake.resources[foreign] = {"name": "someone-elses-vm", "labels": {"team": "infra"}, "status": "RUNNING"}
    operation = create(alpha, alice, gce_spec(nodes=2))
    engine.run(operation.pk)
    engine.run(services.delete_cluster(cluster=Cluster.objects.get(), user=alice).pk)
    assert Cluster.objects.get().status == ClusterStatus.DELETED
    kept = [k for k in fake.resources if k.startswith("gcs:")]  # buckets outlive the cluster (checkpoints)
    assert len(kept) == 3 and [k for k in fake.resources if k not in kept] == [foreign]


def test_it_refuses_a_resource_with_its_name_that_it_did_not_create(fake, alpha, alice):
    prefix = names("alpha", "ultra").prefix
    fake.resources[f"/compute/v1/projects/tcc-test/global/networks/{prefix}-net"] = {"name": f"{prefix}-net"}
    operation = create(alpha, alice, gce_spec(nodes=2))
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert "already exists and was not created by this cluster" in operation.error


def test_it_needs_the_projects_google_cloud_project(fake, alpha, alice):
    operation = create(alpha, alice, gce_spec(nodes=2))
    alpha.gcp_project_id = ""
    alpha.save()
    with pytest.raises(PermanentBackendError, match="has no Google Cloud project id"):
        get_backend("gce").apply_steps(Cluster.objects.get(pk=operation.cluster_id))
    with pytest.raises(SpecError) as info:
        create(alpha, alice, gce_spec(nodes=2), name="other")
    assert "has no Google Cloud project id" in info.value.errors["console.backend"][0]


def test_a_dry_run_lists_the_resources_with_their_names_and_creates_nothing(fake, alice_api):
    response = alice_api.post(
        "/api/v1/projects/alpha/clusters/?dry_run=true",
        {"cluster_id": "ultra", "spec": gce_spec(nodes=3)},
        format="json",
    )
    assert response.status_code == 200
    body = response.json()
    prefix = names("alpha", "ultra").prefix
    plan = {(item["kind"], item["name"]) for item in body["plan"]}
    assert ("VPC network", f"{prefix}-net") in plan
    assert ("Managed Lustre", f"{prefix}-lustre") in plan
    assert ("bulkInsert", f"{prefix}-a3ultra-0 .. {prefix}-a3ultra-2") in plan
    account = names("alpha", "ultra").service_account_id
    assert ("Service account", f"{account}@tcc-test.iam.gserviceaccount.com") in plan
    assert body["estimated_cost_per_hour"] > 0
    assert not Cluster.objects.exists()
    assert sum(fake.calls.values()) == 0


def test_a_dry_run_reports_a_bad_spec_like_a_create(alice_api):
    spec = example_spec()
    spec["display_name"] = "NO"
    response = alice_api.post(
        "/api/v1/projects/alpha/clusters/?dry_run=true", {"cluster_id": "x", "spec": spec}, format="json"
    )
    assert response.status_code == 400
    assert "display_name" in response.json()["spec"]


def metadata(fake, instance):
    prefix = names("alpha", "ultra").prefix
    resource = fake.resources[f"/compute/v1/projects/tcc-test/zones/us-central1-b/instances/{prefix}-{instance}"]
    return {item["key"]: item["value"] for item in resource["metadata"]["items"]}


def test_the_controller_gets_slurm_conf_and_a_resize_updates_it(fake, alpha, alice):
    spec = gce_spec(nodes=2)
    spec["orchestrator_spec"]["slurm_spec"]["scheduling"] = {"priority_type": "priority/multifactor"}
    spec["orchestrator_spec"]["slurm_spec"]["epilog_bash_scripts"] = ["tcc_gpu_check"]
    operation = create(alpha, alice, spec)
    engine.run(operation.pk)
    prefix = names("alpha", "ultra").prefix
    conf = metadata(fake, "ctl")["slurm-conf"]
    assert f"SlurmctldHost={prefix}-ctl" in conf
    assert f"NodeName=a3ultra-[0-1] NodeHostname={prefix}-a3ultra-[0-1] CPUs=224" in conf
    assert "Gres=gpu:8" in conf
    assert "PriorityType=priority/multifactor" in conf
    assert "PartitionName=a3ultra Nodes=a3ultra-[0-1] Default=YES" in conf
    assert metadata(fake, "login-0")["slurm-conf"] == conf
    assert "--conf-server" in metadata(fake, "ctl")["startup-script"]
    # Jobs are confined to their cores, memory and GPUs (cgroup v2), and slurmd runs as Slurm's unit does.
    assert "ConstrainDevices=yes" in metadata(fake, "ctl")["slurm-cgroup-conf"]
    assert "CgroupPlugin=cgroup/v2" in metadata(fake, "ctl")["slurm-cgroup-conf"]
    assert "--property=Delegate=yes --property=LimitMEMLOCK=infinity" in metadata(fake, "a3ultra-0")["startup-script"]
    # The Prolog is always there: each node takes the console's new accounts in it (the spec has no prolog).
    assert "Epilog=/etc/slurm/epilog.sh" in conf and "Prolog=/etc/slurm/prolog.sh" in conf
    assert metadata(fake, "a3ultra-0")["slurm-prolog"] == ""
    # Configless compute nodes are not sent the epilog with slurm.conf: each gets it in its metadata.
    epilog = metadata(fake, "a3ultra-0")["slurm-epilog"]
    assert epilog == metadata(fake, "ctl")["slurm-epilog"] and epilog.endswith("tcc_gpu_check\n")
    assert "SLURM_CONF=/var/spool/slurmd/conf-cache/slurm.conf" in epilog
    assert metadata(fake, "a3ultra-0")["slurm-prolog"] == ""
    spec["node_pools"][1]["scaling_spec"] = {"min_node_count": 3, "max_node_count": 3}
    engine.run(services.update_cluster(cluster=Cluster.objects.get(), spec=spec).pk)
    assert "NodeName=a3ultra-[0-2]" in metadata(fake, "ctl")["slurm-conf"]
    assert fake.calls["POST setMetadata"] == 2  # controller and login node


def test_the_clusters_keys_live_only_in_secret_manager(fake, alpha, alice):
    operation = create(alpha, alice, gce_spec(nodes=2))
    engine.run(operation.pk)
    cluster = Cluster.objects.get()
    stored = str(cluster.backend_state) + str(list(Operation.objects.values())) + str(list(cluster.events.values()))
    prefix = names("alpha", "ultra").prefix
    for kind, size in (("munge", 1024), ("jwt", 32), ("agent", 32)):
        secret = f"projects/tcc-test/secrets/{prefix}-{kind}-key"
        versions = fake.secret_versions[secret]
        assert len(versions) == 1
        key = versions[0]["data"]  # base64 in JSON, as the API carries it
        assert len(base64.b64decode(key)) == size
        assert key not in stored
        assert all(key not in str(item) for item in fake.instances().values())
        assert base64.b64decode(key).hex() not in stored
    step = next(
        s for s in get_backend("gce").apply_steps(cluster) if s.name == "Create the cluster's keys in Secret Manager"
    )
    step.run(None)  # a rerun adds no second key
    assert len(fake.secret_versions[f"projects/tcc-test/secrets/{prefix}-munge-key"]) == 1
    engine.run(services.delete_cluster(cluster=cluster).pk)
    assert not [name for name in fake.secret_versions if prefix in name]


def test_a_console_that_only_provisions_sees_the_instances_and_restarts_them_through_compute(fake, alpha, alice):
    engine.run(create(alpha, alice, gce_spec(nodes=2)).pk)
    cluster = Cluster.objects.get()
    assert cluster.status == ClusterStatus.READY
    assert "(no first health scan: the gce backend cannot run jobs" in cluster.events.first().message
    prefix = names("alpha", "ultra").prefix
    path = f"/compute/v1/projects/tcc-test/zones/us-central1-b/instances/{prefix}-a3ultra-1"
    fake.resources[path]["status"] = "TERMINATED"  # a host error took the machine down
    backend = get_backend("gce")
    status = next(s for s in backend.node_statuses(cluster) if s.name == "a3ultra-1")
    assert (status.state, status.reason) == ("down", "Compute Engine instance TERMINATED")
    backend.reboot(cluster, "a3ultra-1")
    assert (
        fake.resources[path]["status"] == "RUNNING" and fake.resources[path]["starts"] == 1
    )  # a reset needs it running
    backend.reboot(cluster, "a3ultra-1")
    assert fake.resources[path]["resets"] == 1
    fake.resources[path]["marker"] = "old disk"
    backend.reinstall(cluster, "a3ultra-1")
    assert path in fake.resources and "marker" not in fake.resources[path]  # made again from the template


def test_two_console_projects_on_one_gcp_project_never_share_a_name_or_a_firewall(
    fake, alpha, alice, charlie, charlies_project
):
    charlies_project.gcp_project_id = "tcc-test"  # the same Google Cloud project as alpha's
    charlies_project.save()
    ours, theirs = names("alpha", "ultra"), names("charlie-lab", "ultra")
    assert ours.prefix != theirs.prefix and len(ours.prefix.rsplit("-", 1)[1]) == 16
    for project, user in ((alpha, alice), (charlies_project, charlie)):
        operation = create(project, user, gce_spec(nodes=2))
        engine.run(operation.pk)
        operation.refresh_from_db()
        assert operation.status == OperationStatus.SUCCEEDED, operation.error
    firewalls = "/compute/v1/projects/tcc-test/global/firewalls/"
    internal = fake.resources[f"{firewalls}{ours.firewall_internal}"]
    assert internal["sourceTags"] == internal["targetTags"] == [ours.cluster_tag]
    assert "sourceRanges" not in internal
    ssh = fake.resources[f"{firewalls}{ours.firewall_ssh}"]
    assert ssh["sourceRanges"] == ["35.235.240.0/20"]  # IAP's TCP forwarding range, not 0.0.0.0/0
    template = fake.resources[f"/compute/v1/projects/tcc-test/global/instanceTemplates/{ours.prefix}-tpl-a3ultra"]
    assert template["properties"]["tags"]["items"] == [f"{ours.prefix}-compute", ours.cluster_tag]
    assert len(fake.instances()) == 2 * (2 + 2)
    # Deleting charlie's cluster leaves every one of alice's resources.
    mine = {path for path in fake.resources if ours.prefix in path}
    engine.run(services.delete_cluster(cluster=Cluster.objects.get(project=charlies_project), user=charlie).pk)
    assert mine <= set(fake.resources)
    assert not [path for path in fake.resources if theirs.prefix in path]


def test_a_cluster_created_with_the_old_short_names_keeps_them(fake, alpha, alice):
    operation = create(alpha, alice, gce_spec(nodes=2))
    legacy = "ultra-1a2b"
    Cluster.objects.filter(pk=operation.cluster_id).update(backend_state={"gce_prefix": legacy})
    engine.run(operation.pk)
    assert f"/compute/v1/projects/tcc-test/zones/us-central1-b/instances/{legacy}-a3ultra-1" in fake.resources
    assert not [path for path in fake.resources if names("alpha", "ultra").prefix in path]


def test_vms_get_a_service_account_storage_addresses_the_gpu_image_and_gres(fake, alpha, alice, settings):
    """What a VM needs to boot, asserted on the requests the fake Compute API received."""
    settings.GCE_GPU_IMAGE = "projects/acme-images/global/images/family/gpu-driver-dcgm"
    spec = gce_spec(nodes=2)
    spec["runtime_spec"] = {"service_account": "trainer@tcc-test.iam.gserviceaccount.com"}
    fake.add_service_account("trainer@tcc-test.iam.gserviceaccount.com")
    prefix = built(alpha, alice, spec)
    template = template_of(fake, prefix)
    controller = fake.resources[f"/compute/v1/projects/tcc-test/zones/us-central1-b/instances/{prefix}-ctl"]
    for resource in (template["properties"], controller):
        assert resource["serviceAccounts"] == [
            {"email": "trainer@tcc-test.iam.gserviceaccount.com", "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
        ]  # fmt: skip
    assert template["properties"]["disks"][0]["initializeParams"]["sourceImage"] == settings.GCE_GPU_IMAGE
    assert controller["disks"][0]["initializeParams"]["sourceImage"] == settings.GCE_IMAGE

    filestore = next(r for k, r in fake.resources.items() if k.startswith("file:"))
    lustre = next(r for k, r in fake.resources.items() if k.startswith("lustre:"))
    items = template["properties"]["metadata"]["items"]
    worker_script = next(i["value"] for i in items if i["key"] == "startup-script")
    assert f"HOME_SHARE='{filestore['networks'][0]['ipAddresses'][0]}:/home'" in worker_script
    assert f"LUSTRE='{lustre['mountPoint']}'" in worker_script
    assert "GPUS='8'" in worker_script and "nvidia-smi" in worker_script
    mounts = [line for line in worker_script.splitlines() if "mount " in line or "gcsfuse " in line]
    assert mounts and not [line for line in mounts if "|| true" in line]  # no failed mount passes silently
    assert "GPUS='0'" in metadata(fake, "ctl")["startup-script"]
    gres = metadata(fake, "ctl")["slurm-gres-conf"]
    assert "NodeName=a3ultra-[0-1] Name=gpu File=/dev/nvidia[0-7]" in gres

    Cluster.objects.all().delete()
    del spec["runtime_spec"]
    template = template_of(fake, built(alpha, alice, spec, name="plain"))
    account_id = names("alpha", "plain").service_account_id
    assert template["properties"]["serviceAccounts"][0]["email"] == f"{account_id}@tcc-test.iam.gserviceaccount.com"
    settings.GCE_SERVICE_ACCOUNT = "default"  # the project's Compute Engine default account, shared
    template = template_of(fake, built(alpha, alice, spec, name="shared"))
    assert template["properties"]["serviceAccounts"][0]["email"] == "default"


def test_a_service_account_that_is_not_an_email_is_refused(alice_api):
    spec = gce_spec(nodes=2)
    for bad in ("trainer", "trainer@gmail.com", 7, ["x"]):
        spec["runtime_spec"] = {"service_account": bad}
        response = alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "sa", "spec": spec}, format="json")
        assert response.status_code == 400, bad
        assert "runtime_spec.service_account" in response.json()["spec"], response.json()
    spec["runtime_spec"] = {"service_acount": "x"}
    response = alice_api.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "sa", "spec": spec}, format="json")
    assert response.status_code == 400


@pytest.mark.parametrize(
    ("architecture", "machine", "nics", "types", "extra_networks"),
    [
        ("a3-ultra", "a3ultra", 10, ["GVNIC"] * 2 + ["MRDMA"] * 8, ["net2", "rdma"]),
        ("a3-mega", "a3mega", 9, ["GVNIC"] * 9, [f"gpu{i}" for i in range(8)]),
    ],
)
def test_each_reference_architecture_gets_its_gpu_fabric(fake, alpha, alice, architecture, machine, nics, types,
                                                         extra_networks):  # fmt: skip
    spec = build_spec(architecture, display_name="fab", zone="us-central1-b", nodes=2, backend="gce")
    prefix = built(alpha, alice, spec, name="fab")
    template = template_of(fake, prefix, spec["node_pools"][1]["id"])
    interfaces = template["properties"]["networkInterfaces"]
    assert len(interfaces) == nics
    assert [nic.get("nicType") for nic in interfaces] == types
    assert interfaces[0]["subnetwork"].endswith(f"/subnetworks/{prefix}-subnet")
    networks = {k.rsplit("/", 1)[-1]: r for k, r in fake.resources.items() if "/global/networks/" in k}
    for name in extra_networks:
        assert f"{prefix}-{name}" in networks
    if architecture == "a3-ultra":
        rdma = networks[f"{prefix}-rdma"]
        assert rdma["networkProfile"].endswith("/networkProfiles/us-central1-b-vpc-roce")
        subnets = [k for k in fake.resources if f"/subnetworks/{prefix}-rdma-sub" in k]
        assert len(subnets) == 8
    else:
        assert all(networks[f"{prefix}-gpu{i}"]["mtu"] == 8244 for i in range(8))
    controller = fake.resources[f"/compute/v1/projects/tcc-test/zones/us-central1-b/instances/{prefix}-ctl"]
    assert len(controller["networkInterfaces"]) == 1  # the fabric is the GPU nodes'
    firewalls = [k for k in fake.resources if "/global/firewalls/" in k and k.endswith("-internal")]
    rdma = [name for name in extra_networks if name == "rdma"]  # a RoCE VPC takes no firewall rule
    assert len(firewalls) == 1 + len(extra_networks) - len(rdma)
    docker = ipaddress.ip_network("172.16.0.0/12")  # Docker's bridges on the nodes (TCPXO runs in Docker)
    ranges = [r["ipCidrRange"] for k, r in fake.resources.items() if "/subnetworks/" in k]
    assert ranges and not any(ipaddress.ip_network(r).overlaps(docker) for r in ranges)

    engine.run(services.delete_cluster(cluster=Cluster.objects.get(), user=alice).pk)
    assert not [k for k in fake.resources if "/global/networks/" in k or "/subnetworks/" in k]


def test_an_a4x_pool_boots_an_arm64_image_with_a_rdma_nic_per_gpu(fake, alpha, alice, settings):
    """A4X (Grace Arm CPUs, 4 GB200 GPUs): refused while no Arm64 image is set (an x86 one cannot boot it:
    the fake refuses it as Compute does); with one, its template boots it with 4 MRDMA NICs, one per GPU,
    and the RDMA VPC has 4 subnets."""
    spec = build_spec("a4", display_name="gb", zone="us-central1-b", nodes=2, backend="gce")
    spec["node_pools"][1]["machine_spec"] = {"machine_type": "a4x-highgpu-4g"}
    settings.GCE_GPU_ARM64_IMAGE = ""
    with pytest.raises(SpecError) as refused:
        create(alpha, alice, spec, name="gb")
    assert "a4x-highgpu-4g has Arm CPUs and boots only an Arm64 image" in str(
        refused.value.errors["node_pools[1].machine_spec.machine_type"]
    )
    settings.GCE_GPU_ARM64_IMAGE = "projects/tcc-test/global/images/family/tcc-gpu-node-arm64"
    prefix = built(alpha, alice, spec, name="gb")
    properties = template_of(fake, prefix, spec["node_pools"][1]["id"])["properties"]
    assert properties["disks"][0]["initializeParams"]["sourceImage"] == settings.GCE_GPU_ARM64_IMAGE
    assert [nic.get("nicType") for nic in properties["networkInterfaces"]] == ["GVNIC"] * 2 + ["MRDMA"] * 4
    assert len([k for k in fake.resources if f"/subnetworks/{prefix}-rdma-sub" in k]) == 4
    controller = fake.resources[f"/compute/v1/projects/tcc-test/zones/us-central1-b/instances/{prefix}-ctl"]
    assert "arm64" not in controller["disks"][0]["initializeParams"]["sourceImage"]  # the controller is x86


def test_a_spot_vm_the_cloud_takes_back_is_detected_and_made_again(fake, alpha, alice):
    """Provisioning only; the whole repair on booted VMs is in tests/test_gce_boot.py."""
    spec = gce_spec(nodes=2)
    spec["node_pools"][1]["provisioning_model"] = "SPOT"
    prefix = built(alpha, alice, spec)
    cluster = Cluster.objects.get()
    path = f"/compute/v1/projects/tcc-test/zones/us-central1-b/instances/{prefix}-a3ultra-1"
    template = template_of(fake, prefix)
    assert template["properties"]["scheduling"]["instanceTerminationAction"] == "DELETE"
    del fake.resources[path]  # preempted: Compute deletes a Spot VM whose termination action is DELETE
    status = next(s for s in get_backend("gce").node_statuses(cluster) if s.name == "a3ultra-1")
    assert (status.state, status.reason) == ("down", "Compute Engine: the Spot VM was taken back")
    fake.reset_calls()
    get_backend("gce").reboot(cluster, "a3ultra-1")  # the repair ladder's first rung
    assert path in fake.resources and fake.calls["POST bulkInsert"] == 1  # made again from the template


def test_flex_start_vms_get_a_max_run_duration(fake, alpha, alice, settings):
    settings.GCE_FLEX_START_MAX_RUN_HOURS = 24
    spec = gce_spec(nodes=2)
    spec["node_pools"][1]["provisioning_model"] = "FLEX_START"
    spec["node_pools"][1]["machine_spec"].pop("reservation_affinity", None)
    prefix = built(alpha, alice, spec)
    template = template_of(fake, prefix)
    scheduling = template["properties"]["scheduling"]
    assert scheduling["provisioningModel"] == "FLEX_START"
    assert scheduling["maxRunDuration"]["seconds"] in (86400, "86400")


def test_a_controller_whose_startup_fails_fails_the_create_with_its_failing_line(fake, alpha, alice, settings):
    settings.GCE_STARTUP_TIMEOUT = 30
    operation = create(alpha, alice, gce_spec(nodes=2))
    steps = get_backend("gce").apply_steps(operation.cluster)
    for step in steps[:-1]:  # everything up to the wait for the startup scripts
        step.run(None)
    prefix = names("alpha", "ultra").prefix
    controller = fake.resources[f"/compute/v1/projects/tcc-test/zones/us-central1-b/instances/{prefix}-ctl"]
    controller["serialOutput"] = (
        "google_metadata_script_runner[812]: startup-script: mount.nfs: Connection timed out\n"
        "google_metadata_script_runner[812]: startup-script: tcc-startup: FAILED: mounting /home from 10.90.1.2:/home\n"
    )
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.FAILED
    assert "FAILED: mounting /home from 10.90.1.2:/home" in operation.error and f"{prefix}-ctl" in operation.error
    timeline = " ".join(Cluster.objects.get().events.values_list("message", flat=True))
    assert "FAILED: mounting /home from 10.90.1.2:/home (from its serial console)" in timeline


def quota(metric, limit, usage=0):
    return {"metric": metric, "limit": limit, "usage": usage}


def test_preflight_checks_apis_quotas_and_the_reservation(fake, alpha, alice, tmp_path, settings):
    """Dana's platform team runs `manage.py preflight` before the create: it names what is missing."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    spec = gce_spec(nodes=4)
    pool = spec["node_pools"][1]
    pool["machine_spec"]["reservation_affinity"] = {
        "reservation_affinity_type": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["h200-block"],
    }
    fake.region_quotas["us-central1"] = [quota("N2_CPUS", 100, 90), quota("NVIDIA_H200_GPUS", 64, 40),
                                         quota("PREEMPTIBLE_NVIDIA_H200_GPUS", 512),
                                         quota("IN_USE_ADDRESSES", 8, 8)]  # fmt: skip
    fake.enabled_services.discard("lustre.googleapis.com")
    fake.resources["/compute/v1/projects/tcc-test/zones/us-central1-b/reservations/h200-block"] = {
        "name": "h200-block",
        "specificReservation": {
            "count": "4",
            "inUseCount": "1",
            "instanceProperties": {"machineType": "a3-ultragpu-8g"},
        },
    }
    findings = {f.check: f for f in services.preflight(project=alpha, spec=spec)}
    assert findings["API compute.googleapis.com"].status == "ok"
    assert findings["API lustre.googleapis.com"].status == "fail"
    assert "gcloud services enable lustre.googleapis.com" in findings["API lustre.googleapis.com"].detail
    gpus = findings["NVIDIA_H200_GPUS in us-central1"]
    assert gpus.status == "fail" and "needs 32, 24 free (limit 64, in use 40)" in gpus.detail  # 4 nodes x 8
    cpus = findings["N2_CPUS in us-central1"]  # n2 vCPUs count against their family's quota, not CPUS
    assert cpus.status == "fail" and "needs 16, 10 free" in cpus.detail  # the login node and the controller
    assert findings["reservation h200-block"].status == "fail" and "3 of 4" in findings["reservation h200-block"].detail
    addresses = findings["IN_USE_ADDRESSES in us-central1"]  # the login node's external address (its spec's)
    assert addresses.status == "fail" and "external addresses: the spec needs 1, 0 free" in addresses.detail
    settings.GCE_CONTROLLER_ACCESS = "external"  # the controller's too
    found = {f.check: f for f in services.preflight(project=alpha, spec=spec)}["IN_USE_ADDRESSES in us-central1"]
    assert "the spec needs 2, 0 free" in found.detail
    settings.GCE_CONTROLLER_ACCESS = "internal"

    fake.enabled_services.add("lustre.googleapis.com")
    fake.region_quotas["us-central1"] = [quota("N2_CPUS", 1000), quota("NVIDIA_H200_GPUS", 64),
                                         quota("IN_USE_ADDRESSES", 8)]  # fmt: skip
    fake.resources["/compute/v1/projects/tcc-test/zones/us-central1-b/reservations/h200-block"][
        "specificReservation"]["inUseCount"] = "0"  # fmt: skip
    assert {f.status for f in services.preflight(project=alpha, spec=spec)} == {"ok"}
    import io
    import json

    path = tmp_path / "ultra.json"
    path.write_text(json.dumps(spec))
    out = io.StringIO()
    call_command("preflight", str(path), "--project", "alpha", stdout=out)
    assert "OK    NVIDIA_H200_GPUS in us-central1: NVIDIA_H200_141GB: the spec needs 32, 64 free" in out.getvalue()
    pool["scaling_spec"] = {"min_node_count": 8, "max_node_count": 8}
    path.write_text(json.dumps(spec))
    out = io.StringIO()
    with pytest.raises(CommandError, match="checks failed"):
        call_command("preflight", str(path), "--project", "alpha", stdout=out)
    assert "FAIL  reservation h200-block: 4 of 4" in out.getvalue()
    # A reservation shared from the platform team's project is read there, not in the cluster's project.
    pool["scaling_spec"] = {"min_node_count": 4, "max_node_count": 4}
    pool["machine_spec"]["reservation_affinity"]["values"] = ["projects/gpu-pool/reservations/shared-block"]
    shared = {"name": "shared-block", "specificReservation": {"count": "8", "inUseCount": "2"}}
    fake.resources["/compute/v1/projects/gpu-pool/zones/us-central1-b/reservations/shared-block"] = shared
    found = {f.check: f for f in services.preflight(project=alpha, spec=spec)}["reservation shared-block"]
    assert found.status == "ok" and "6 of 8" in found.detail
    del fake.resources["/compute/v1/projects/gpu-pool/zones/us-central1-b/reservations/shared-block"]
    found = {f.check: f for f in services.preflight(project=alpha, spec=spec)}["reservation shared-block"]
    assert found.status == "fail" and "not found in project gpu-pool" in found.detail
    # A console that reaches its clusters needs a route to the new VPC: its peering with the workers' network.
    settings.GCE_REACH_CLUSTERS, settings.GCE_CONSOLE_NETWORK = True, ""
    found = {f.check: f for f in services.preflight(project=alpha, spec=spec)}["console reach"]
    assert found.status == "fail" and "GCE_CONSOLE_RANGES is empty" in found.detail
    settings.GCE_CONSOLE_RANGES = ["10.200.0.0/24"]
    found = {f.check: f for f in services.preflight(project=alpha, spec=spec)}["console reach"]
    assert found.status == "fail" and "no route to this cluster's new VPC: set GCE_CONSOLE_NETWORK" in found.detail
    settings.GCE_CONSOLE_NETWORK = "projects/ops/global/networks/console"
    found = {f.check: f for f in services.preflight(project=alpha, spec=spec)}["console reach"]
    assert found.status == "ok" and found.detail == "peered with projects/ops/global/networks/console"
    del pool["machine_spec"]["reservation_affinity"]
    spec["node_pools"][1]["machine_spec"]["machine_type"] = "a3-ultragpu-9g"
    with pytest.raises(SpecError):
        services.preflight(project=alpha, spec=spec)
