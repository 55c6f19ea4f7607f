# ruff: noqa: E501 (the table of fields reads best one field to a line or two)
"""Every field of the cluster spec has an effect on a gce cluster, or a spec using it is refused with a
400 naming it: nothing is dropped silently (a user's /home on Lustre once was: every node got its own
local /home). The table below covers each field the validator accepts; a field added to the schema
without an entry here fails test_every_field_of_the_schema_is_in_the_table."""

from dataclasses import dataclass

import pytest

from clusters import services
from clusters.backends.gce.names import names
from clusters.models import Cluster
from clusters.operations import engine
from clusters.spec import console_block as console_keys
from clusters.spec import validator as spec_keys

from .conftest import gce_spec

pytestmark = pytest.mark.django_db

PROJECT, ZONE, REGION = "tcc-test", "us-central1-a", "us-central1"
HOME = f"projects/{PROJECT}/locations/{ZONE}/instances/team-home"
SCRATCH = f"projects/{PROJECT}/locations/{ZONE}/instances/scratch"


def schema_fields():
    levels = [
        ("", spec_keys.TOP_LEVEL),
        ("node_pools[].", spec_keys.NODE_POOL),
        ("node_pools[].machine_spec.", spec_keys.MACHINE_SPEC),
        ("orchestrator_spec.slurm_spec.", spec_keys.SLURM_SPEC),
        ("console.", console_keys.CONSOLE),
        ("console.network.", console_keys.NETWORK),
        ("console.storage.", console_keys.STORAGE),
    ]
    return {prefix + key for prefix, keys in levels for key in keys}


class Seen:
    """What a built cluster left: the fake's resources and the cluster, with readers for the checks."""

    def __init__(self, fake, cluster):
        self.fake, self.cluster = fake, cluster
        self.prefix = names(cluster.project.slug, cluster.name).prefix

    def instance(self, node):
        return self.fake.resources[f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{self.prefix}-{node}"]

    def template(self, pool="cpu"):
        return self.fake.resources[f"/compute/v1/projects/{PROJECT}/global/instanceTemplates/{self.prefix}-tpl-{pool}"]

    def metadata(self, resource):
        items = (resource.get("metadata") or resource["properties"]["metadata"])["items"]
        return {i["key"]: i["value"] for i in items}

    @property
    def conf(self):
        return self.metadata(self.instance("ctl"))["slurm-conf"]

    def keys(self, part):
        return [k for k in self.fake.resources if part in k]


@dataclass
class Field:
    path: str
    change: object  # spec -> None: set the field to something other than the baseline
    shows: object = None  # Seen -> bool: the effect, on what the cloud received or the cluster
    refused: str = ""  # or: the spec is refused with this field path in the 400


def pool(spec, i=1):
    return spec["node_pools"][i]


def slurm(spec):
    return spec["orchestrator_spec"]["slurm_spec"]


def existing(spec, key, name):
    spec["console"]["storage"].pop("filestore_home", None)
    if key == "home":
        slurm(spec)["home_directory_storage"] = name
    else:
        pool(spec)[key] = [name]


FIELDS = [
    Field("display_name", lambda s: s.update(display_name="other"), lambda w: w.cluster.display_name == "other"),
    Field("description", lambda s: s.update(description="Dana's team, Llama SFT"),
          lambda w: w.cluster.description == "Dana's team, Llama SFT"),
    Field("labels", lambda s: s.update(labels={"team": "dana", "cost-center": "ml-42"}),
          lambda w: w.template()["properties"]["labels"]["cost-center"] == "ml-42"
          and w.instance("ctl")["labels"]["team"] == "dana"),
    Field("network", lambda s: (s["console"]["network"].update(create=False), s["console"]["storage"].clear(),
                                s.update(network={"network": "projects/host-proj/global/networks/shared",
                                                  "subnetwork": "projects/host-proj/regions/us-central1/subnetworks/s"})),
          lambda w: w.template()["properties"]["networkInterfaces"][0]["network"]
          == "projects/host-proj/global/networks/shared"),
    Field("node_pools", lambda s: s.pop("node_pools"), refused="node_pools"),
    Field("orchestrator_spec", lambda s: s.pop("orchestrator_spec"), refused="orchestrator_spec"),
    Field("runtime_spec", lambda s: s.update(runtime_spec={"service_account": "cluster-nodes@tcc-test.iam.gserviceaccount.com"}),
          lambda w: w.template()["properties"]["serviceAccounts"][0]["email"] == "cluster-nodes@tcc-test.iam.gserviceaccount.com"),
    Field("console", lambda s: s.update(console={"backend": "gce"}),  # the spec's own VPC, no storage of the console's
          lambda w: not w.keys("/global/networks/") and not w.keys(f"{w.prefix}-home")),
    Field("node_pools[].id", lambda s: (pool(s).update(id="work"), slurm(s)["partitions"][0].update(node_pool_ids=["work"])),
          lambda w: w.keys("-tpl-work")),
    Field("node_pools[].machine_spec", lambda s: pool(s)["machine_spec"].update(machine_type="c2-standard-4"),
          lambda w: w.template()["properties"]["machineType"] == "c2-standard-4"),
    Field("node_pools[].provisioning_model", lambda s: pool(s).update(provisioning_model="SPOT"),
          lambda w: w.template()["properties"]["scheduling"]["provisioningModel"] == "SPOT"),
    Field("node_pools[].scaling_spec", lambda s: pool(s).update(scaling_spec={"min_node_count": 3, "max_node_count": 3}),
          lambda w: len(w.keys("-cpu-")) == 3),
    Field("node_pools[].zone", lambda s: [p.update(zone="us-central1-b") for p in s["node_pools"]],
          lambda w: w.keys("/zones/us-central1-b/instances/")),
    Field("node_pools[].enable_public_ips", lambda s: pool(s, 0).update(enable_public_ips=False),
          lambda w: not w.instance("login-0")["networkInterfaces"][0].get("accessConfigs")),
    Field("node_pools[].boot_disk", lambda s: pool(s).update(boot_disk={"boot_disk_type": "pd-ssd", "boot_disk_size_gb": 321}),
          lambda w: w.template()["properties"]["disks"][0]["initializeParams"]["diskSizeGb"] in ("321", 321)),
    Field("node_pools[].lustres", lambda s: existing(s, "lustres", SCRATCH),
          lambda w: "lustre 10.9.0.3@tcp:/lustrefs /mnt/scratch" in w.metadata(w.template())["startup-script"]),
    Field("node_pools[].filestores", lambda s: existing(s, "filestores", HOME),
          lambda w: "nfs 10.9.0.2:/home /mnt/team-home" in w.metadata(w.template())["startup-script"]),
    Field("node_pools[].startup_script", lambda s: pool(s).update(startup_script="echo warming the cache\n"),
          lambda w: "echo warming the cache" in w.metadata(w.template())["startup-script"]),
    Field("node_pools[].machine_spec.machine_type", lambda s: pool(s)["machine_spec"].update(machine_type="n2-standard-16"),
          lambda w: w.template()["properties"]["machineType"] == "n2-standard-16"),
    Field("node_pools[].machine_spec.accelerator_type",
          lambda s: pool(s)["machine_spec"].update(accelerator_type="NVIDIA_B200"),
          refused="node_pools[1].machine_spec.accelerator_type"),
    Field("node_pools[].machine_spec.accelerator_count", lambda s: pool(s)["machine_spec"].update(accelerator_count=8),
          refused="node_pools[1].machine_spec.accelerator_count"),
    Field("node_pools[].machine_spec.reservation_affinity",
          lambda s: pool(s)["machine_spec"].update(reservation_affinity={
              "reservation_affinity_type": "SPECIFIC_RESERVATION", "key": "compute.googleapis.com/reservation-name",
              "values": ["n2-block"]}),
          lambda w: w.template()["properties"]["reservationAffinity"]["values"] == ["n2-block"]),
    Field("orchestrator_spec.slurm_spec.partitions",
          lambda s: slurm(s)["partitions"].__setitem__(0, {"id": "batch", "node_pool_ids": ["cpu"]}),
          lambda w: "PartitionName=batch " in w.conf),
    Field("orchestrator_spec.slurm_spec.login_node_pool_id",
          lambda s: (pool(s, 0).update(id="gate"), slurm(s).update(login_node_pool_id="gate")),
          lambda w: w.keys("-gate-0")),
    Field("orchestrator_spec.slurm_spec.home_directory_storage", lambda s: existing(s, "home", HOME),
          lambda w: "nfs 10.9.0.2:/home /home" in w.metadata(w.instance("login-0"))["startup-script"]),
    Field("orchestrator_spec.slurm_spec.accounting", lambda s: slurm(s).update(accounting={"accounting_storage_enforce": "associations"}),
          lambda w: "AccountingStorageEnforce=associations" in w.conf),
    Field("orchestrator_spec.slurm_spec.scheduling", lambda s: slurm(s).update(scheduling={"priority_type": "priority/multifactor"}),
          lambda w: "PriorityType=priority/multifactor" in w.conf),
    Field("orchestrator_spec.slurm_spec.prolog_bash_scripts", lambda s: slurm(s).update(prolog_bash_scripts=["echo hello"]),
          lambda w: "Prolog=/etc/slurm/prolog.sh" in w.conf and "echo hello" in w.metadata(w.template())["slurm-prolog"]),
    Field("orchestrator_spec.slurm_spec.epilog_bash_scripts", lambda s: slurm(s).update(epilog_bash_scripts=["echo bye"]),
          lambda w: "Epilog=/etc/slurm/epilog.sh" in w.conf and "echo bye" in w.metadata(w.template())["slurm-epilog"]),
    Field("console.backend", lambda s: s["console"].update(backend="nowhere"), refused="console.backend"),
    Field("console.network", lambda s: s["console"]["network"].update(subnet_range="10.7.0.0/16"),
          lambda w: any(r.get("ipCidrRange") == "10.7.0.0/16" for r in w.fake.resources.values())),
    Field("console.storage", lambda s: s["console"]["storage"].clear(), lambda w: not w.keys(f"{w.prefix}-home")),
    Field("console.network.create", lambda s: (s["console"]["network"].update(create=False), s["console"]["storage"].clear()),
          lambda w: not w.keys("/global/networks/")),
    Field("console.network.mtu", lambda s: s["console"]["network"].update(mtu=8896),
          lambda w: w.fake.resources[f"/compute/v1/projects/{PROJECT}/global/networks/{w.prefix}-net"]["mtu"] == 8896),
    Field("console.network.subnet_range", lambda s: s["console"]["network"].update(subnet_range="10.8.0.0/16"),
          lambda w: any(r.get("ipCidrRange") == "10.8.0.0/16" for r in w.fake.resources.values())),
    Field("console.network.private_services_range", lambda s: s["console"]["network"].update(private_services_range="10.99.0.0/20"),
          lambda w: any(r.get("address") == "10.99.0.0" for r in w.fake.resources.values())),
    Field("console.network.cloud_nat", lambda s: s["console"]["network"].update(cloud_nat=True), lambda w: w.keys("/routers/")),
    Field("console.storage.filestore_home", lambda s: s["console"]["storage"].update(
        filestore_home={"tier": "ZONAL", "capacity_gb": 2048}),
          lambda w: any(k.startswith("file:") and r.get("fileShares", [{}])[0].get("capacityGb") in (2048, "2048")
                        for k, r in w.fake.resources.items())),
    Field("console.storage.lustre", lambda s: s["console"]["storage"].update(
        lustre={"performance_tier": 500, "capacity_gb": 18000, "mount_point": "/scratch"}),
          lambda w: w.keys("lustre:") and "LUSTRE_MOUNT='/scratch'" in w.metadata(w.template())["startup-script"]),
    Field("console.storage.gcs_buckets", lambda s: s["console"]["storage"].update(
        gcs_buckets=[{"bucket": "dana-ckpts", "mount_point": "/ckpt", "mount_options": ["implicit-dirs"]}]),
          lambda w: "dana-ckpts /ckpt --implicit-dirs -o allow_other" in w.metadata(w.template())["startup-script"]),
]  # fmt: skip


def test_every_field_of_the_schema_is_in_the_table():
    assert sorted(f.path for f in FIELDS) == sorted(schema_fields())


@pytest.mark.parametrize("field", FIELDS, ids=[f.path for f in FIELDS])
def test_each_field_has_an_effect_or_is_refused_naming_it(field, fake, alpha, alice, client):
    fake.add_service_account("cluster-nodes@tcc-test.iam.gserviceaccount.com")  # the user's own account
    fake.resources[f"file:{HOME}"] = {"name": HOME, "networks": [{"ipAddresses": ["10.9.0.2"]}],
                                      "fileShares": [{"name": "home"}]}  # fmt: skip
    fake.resources[f"lustre:{SCRATCH}"] = {"name": SCRATCH, "mountPoint": "10.9.0.3@tcp:/lustrefs"}
    spec = gce_spec(cpu=2)
    field.change(spec)
    if field.refused:
        response = client_for(client, alice).post(
            "/api/v1/projects/alpha/clusters/", {"cluster_id": "walk", "spec": spec}, format="json"
        )
        assert response.status_code == 400, response.content
        assert field.refused in response.json().get("spec", response.json())
        return
    operation = services.create_cluster(project=alpha, name="walk", spec=spec, user=alice)
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "SUCCEEDED", operation.error
    assert field.shows(Seen(fake, Cluster.objects.get(name="walk")))


def client_for(client, user):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(user)
    return api
