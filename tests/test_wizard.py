"""The wizards, server side: drafts, live checks, step actions, review, upload, export and duplicate."""

import io
import json

import pytest

from clusters import wizard
from clusters.backends import all_backends
from clusters.choices import ClusterStatus
from clusters.models import Cluster, Operation
from clusters.spec import validate_spec
from clusters.spec.reference import architectures, build_spec

from .conftest import example_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_web(client, alice, alpha):
    client.force_login(alice)
    return client


def reference(client, **changes):
    form = {
        "project": "alpha",
        "cluster_id": "ref",
        "arch": "cpu",
        "display_name": "ref1",
        "zone": "us-central1-a",
        "nodes": "2",
        "model": "ON_DEMAND",
        "backend": "local",
        **changes,
    }
    return client.post("/clusters/wizard/reference/", form)


def scratch(client, cluster_id="steps"):
    return client.post("/clusters/wizard/scratch/", {"project": "alpha", "cluster_id": cluster_id})


@pytest.mark.parametrize("arch_id", sorted(architectures()))
def test_every_reference_architecture_builds_a_valid_spec(arch_id):
    spec = build_spec(arch_id, display_name="ref1", zone="europe-west4-b", nodes=4, provisioning_model="SPOT")
    assert validate_spec(spec, backends=all_backends())["display_name"] == "ref1"


def test_a_reference_architecture_with_a_reservation_names_it():
    spec = build_spec(
        "a3-ultra", display_name="u1", zone="us-central1-b", nodes=2, provisioning_model="RESERVATION", reservation="r1"
    )
    validate_spec(spec, backends=all_backends())
    assert spec["node_pools"][1]["machine_spec"]["reservation_affinity"]["values"] == ["r1"]
    assert spec["console"]["network"]["mtu"] == 8896


def test_it_takes_alice_from_a_reference_architecture_to_review(alice_web):
    response = reference(alice_web, arch="a3-mega", nodes="4")
    assert response.status_code == 302
    assert response["Location"] == "/clusters/alpha/ref/wizard/review/"
    cluster = Cluster.objects.get(name="ref")
    assert cluster.status == ClusterStatus.DRAFT
    review = alice_web.get(response["Location"]).content.decode()
    assert "<code>a3mega-3</code>" in review  # the local backend's plan: one slurmd per node
    assert "a3-megagpu-8g scaled to this machine" in review
    assert "32" in review  # GPUs this cluster asks for, in the quota table
    assert "Create cluster" in review


def test_it_refuses_a_reference_form_without_nodes_or_reservation(alice_web):
    response = reference(alice_web, nodes="0", model="RESERVATION", reservation="")
    assert response.status_code == 400
    content = response.content.decode()
    assert "enter a node count of 1 or more" in content
    assert "name the reservation to use" in content
    assert not Cluster.objects.exists()


def test_it_checks_a_step_live_and_puts_errors_next_to_fields(alice_web):
    scratch(alice_web)
    response = alice_web.post(
        "/clusters/alpha/steps/wizard/basics/",
        {"live": "1", "cluster_id": "steps", "display_name": "Not Valid", "zone": "us-central1-a", "backend": "local"},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    content = response.content.decode()
    assert 'id="err-display_name"' in content
    assert "must be 1-10 lowercase letters or digits" in content
    assert 'id="err-zone" aria-live="polite" hx-swap-oob="true"></span>' in content  # cleared
    assert Cluster.objects.get().spec["display_name"] == "Not Valid"  # saved as typed


def test_it_keeps_alice_on_a_step_with_errors_and_lets_her_go_on_once_fixed(alice_web):
    scratch(alice_web)
    form = {"cluster_id": "steps", "display_name": "x y", "zone": "us-central1-a", "backend": "local", "go": "compute"}
    response = alice_web.post("/clusters/alpha/steps/wizard/basics/", form)
    assert response.status_code == 400
    assert b"must be 1-10 lowercase letters" in response.content
    response = alice_web.post("/clusters/alpha/steps/wizard/basics/", {**form, "display_name": "good1"})
    assert response.status_code == 302
    assert response["Location"] == "/clusters/alpha/steps/wizard/compute/"


def test_it_renames_a_draft_and_refuses_a_taken_id(alice_web, alice, alpha):
    from clusters import services

    services.create_cluster(project=alpha, name="taken", spec=example_spec(), user=alice)
    scratch(alice_web)
    form = {"cluster_id": "taken", "display_name": "ok", "zone": "us-central1-a", "backend": "local", "go": "compute"}
    response = alice_web.post("/clusters/alpha/steps/wizard/basics/", form)
    assert response.status_code == 400
    assert b"already exists in this project" in response.content
    response = alice_web.post("/clusters/alpha/steps/wizard/basics/", {**form, "cluster_id": "renamed"})
    assert response["Location"] == "/clusters/alpha/renamed/wizard/compute/"


def compute_form(spec, **extra):
    form = {"pools": [str(i) for i in wizard.compute_indices(spec)]}
    for row in wizard.compute_rows(spec):
        i = row["index"]
        for field in ("id", "machine", "count", "model", "reservation", "disk_type", "disk_size", "partition"):
            form[f"pool-{i}-{field}"] = str(row[field])
    form.update(extra)
    return form


def test_it_adds_moves_and_removes_node_pools(alice_web):
    scratch(alice_web)
    url = "/clusters/alpha/steps/wizard/compute/"
    alice_web.post(url, compute_form(Cluster.objects.get().spec, action="add"))
    spec = Cluster.objects.get().spec
    assert [p["id"] for p in spec["node_pools"]] == ["login", "cpu", "pool1"]
    alice_web.post(url, compute_form(spec, action="up-1", **{"pool-2-partition": "cpu"}))
    spec = Cluster.objects.get().spec
    assert [p["id"] for p in spec["node_pools"]] == ["login", "pool1", "cpu"]
    assert spec["orchestrator_spec"]["slurm_spec"]["partitions"] == [{"id": "cpu", "node_pool_ids": ["pool1", "cpu"]}]
    alice_web.post(url, compute_form(spec, action="remove-0"))
    assert [p["id"] for p in Cluster.objects.get().spec["node_pools"]] == ["login", "cpu"]


def test_it_sets_accelerators_from_the_machine_type(alice_web):
    scratch(alice_web)
    spec = Cluster.objects.get().spec
    alice_web.post("/clusters/alpha/steps/wizard/compute/", compute_form(spec, **{"pool-1-machine": "a4-highgpu-8g"}))
    machine = Cluster.objects.get().spec["node_pools"][1]["machine_spec"]
    assert machine == {"machine_type": "a4-highgpu-8g", "accelerator_type": "NVIDIA_B200", "accelerator_count": 8}


def test_it_validates_storage_against_the_tier_limits(alice_web):
    scratch(alice_web)
    form = {
        "live": "1",
        "home-mode": "create",
        "home-tier": "HIGH_SCALE_SSD",
        "home-capacity_gb": "1024",
        "lustre-enabled": "on",
        "lustre-performance_tier": "500",
        "lustre-capacity_gb": "20000",
        "lustre-mount_point": "/lustre",
    }
    content = alice_web.post("/clusters/alpha/steps/wizard/storage/", form, HTTP_HX_REQUEST="true").content.decode()
    assert "HIGH_SCALE_SSD holds 10,240 to 102,400 GB" in content
    assert "must be a multiple of 18,000 GiB" in content


def test_it_creates_the_cluster_from_review(alice_web):
    reference(alice_web)
    response = alice_web.post("/clusters/alpha/ref/wizard/review/")
    assert response.status_code == 302
    assert response["Location"] == "/clusters/alpha/ref/"
    cluster = Cluster.objects.get()
    assert cluster.status == ClusterStatus.PROVISIONING
    assert Operation.objects.get().kind == "CREATE"
    assert sorted(cluster.nodes.values_list("name", flat=True)) == ["cpu-0", "cpu-1", "login-0"]


def test_it_lists_review_problems_with_links_to_their_steps(alice_web):
    scratch(alice_web)
    cluster = Cluster.objects.get()
    cluster.spec["node_pools"][1]["scaling_spec"] = {"min_node_count": 1, "max_node_count": 3}
    cluster.save()
    response = alice_web.post("/clusters/alpha/steps/wizard/review/")
    assert response.status_code == 400
    content = response.content.decode()
    assert 'href="/clusters/alpha/steps/wizard/compute/?check=1"' in content
    assert "disabled" in content
    assert Cluster.objects.get().status == ClusterStatus.DRAFT


def test_it_shows_a_draft_over_quota_and_refuses_to_create_it(alice_web, alpha):
    alpha.gpu_quota = 8
    alpha.save()
    reference(alice_web, arch="a4", nodes="2")
    review = alice_web.get("/clusters/alpha/ref/wizard/review/").content.decode()
    assert "over quota" in review
    response = alice_web.post("/clusters/alpha/ref/wizard/review/", follow=True)
    assert b"Quota exceeded: GPUs" in response.content
    assert Cluster.objects.get().status == ClusterStatus.DRAFT


def test_it_opens_an_uploaded_spec_in_review(alice_web):
    upload = io.BytesIO(json.dumps(example_spec()).encode())
    upload.name = "mine.json"
    response = alice_web.post("/clusters/wizard/upload/", {"project": "alpha", "cluster_id": "up", "spec_file": upload})
    assert response["Location"] == "/clusters/alpha/up/wizard/review/"
    assert Cluster.objects.get().spec["node_pools"][1]["id"] == "cpu"


@pytest.mark.parametrize(
    ("content", "message"), [(b"{oops", b"not valid JSON"), (b"[1, 2]", b"must hold one JSON object")]
)
def test_it_refuses_an_upload_that_is_not_a_spec(alice_web, content, message):
    upload = io.BytesIO(content)
    upload.name = "bad.json"
    response = alice_web.post("/clusters/wizard/upload/", {"project": "alpha", "cluster_id": "up", "spec_file": upload})
    assert response.status_code == 400
    assert message in response.content
    assert not Cluster.objects.exists()


def test_it_exports_a_clusters_spec_and_duplicates_it(alice_web, alice, alpha):
    from clusters import services

    services.create_cluster(project=alpha, name="orig", spec=example_spec(cpu=3), user=alice)
    exported = alice_web.get("/clusters/alpha/orig/spec.json?download=1")
    assert exported["Content-Disposition"] == 'attachment; filename="orig.json"'
    assert json.loads(exported.content)["node_pools"][1]["scaling_spec"]["min_node_count"] == 3
    response = alice_web.post("/clusters/alpha/orig/duplicate/")
    assert response["Location"] == "/clusters/alpha/orig-copy/wizard/basics/"
    copy = Cluster.objects.get(name="orig-copy")
    assert copy.status == ClusterStatus.DRAFT
    assert copy.spec == json.loads(exported.content)


def test_charlie_cannot_see_alices_drafts_or_specs(client, charlie, charlies_project, alice_web):
    reference(alice_web)
    client.force_login(charlie)
    assert client.get("/clusters/alpha/ref/wizard/review/").status_code == 404
    assert client.get("/clusters/alpha/ref/wizard/basics/").status_code == 404
    assert client.get("/clusters/alpha/ref/spec.json").status_code == 404
    assert client.post("/clusters/alpha/ref/duplicate/").status_code == 404


def test_it_discards_a_draft_at_once(alice_web):
    reference(alice_web)
    alice_web.post("/clusters/alpha/ref/delete/", {"confirm": "ref"})
    assert Cluster.objects.get().status == ClusterStatus.DELETED
    assert Operation.objects.get().status == "SUCCEEDED"
    assert reference(alice_web).status_code == 302  # the id is free again


def test_it_routes_each_error_path_to_its_step_and_field():
    spec = example_spec()
    assert wizard.route("node_pools[1].scaling_spec", spec) == ("compute", "pool-1-count")
    assert wizard.route("node_pools[0].boot_disk.boot_disk_size_gb", spec) == ("login", "login-disk_size")
    assert wizard.route("node_pools[1].zone", spec) == ("basics", "zone")
    assert wizard.route("console.storage.gcs_buckets[2].mount_point", spec) == ("storage", "gcs-2-mount_point")
    assert wizard.route("console.network.subnet_range", spec) == ("network", "net-subnet_range")
    assert wizard.route("orchestrator_spec.slurm_spec.scheduling.preempt_mode", spec) == ("slurm", "slurm-preempt_mode")
    assert wizard.route("orchestrator_spec.slurm_spec.partitions[0].node_pool_ids[0]", spec) == ("compute", None)
