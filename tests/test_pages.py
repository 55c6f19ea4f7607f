"""Pages: login everywhere, empty states, the new-cluster form, polling fragments and API tokens."""

import pytest

from clusters.choices import ClusterStatus, OperationStatus
from clusters.models import Cluster, Operation
from console.models import APIToken, digest

from .conftest import example_spec, provisioned

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/", "/clusters/new/", "/tokens/", "/clusters/alpha/demo/", "/api/docs/"])
def test_it_sends_anonymous_visitors_to_the_login_page(client, path):
    response = client.get(path)
    assert response.status_code in (302, 401, 403)
    if response.status_code == 302:
        assert response["Location"].startswith("/accounts/login/")


def test_it_tells_a_user_without_projects_what_to_do(client, charlie):
    client.force_login(charlie)
    assert b"You are not a member of any project yet" in client.get("/").content


def test_it_invites_alice_to_create_her_first_cluster(alice_web):
    content = alice_web.get("/").content
    assert b"No clusters yet" in content
    assert b"Create your first cluster" in content


def test_it_lists_alices_clusters_on_the_dashboard(alice_web, demo):
    content = alice_web.get("/").content.decode()
    assert 'href="/clusters/alpha/demo/"' in content
    assert "Provisioning" in content


def test_the_dashboard_is_the_projects_overview_and_shows_charlie_none_of_it(alice_web, demo, client, charlie,
                                                                            charlies_project):  # fmt: skip
    """alice sees at a glance what is happening in alpha: the cluster with a node failing its checks, the
    run training (its bar and loss), the newest model version, and the endpoint's traffic and errors.
    The dashboard listed clusters only."""
    from datetime import timedelta

    from django.utils import timezone

    from clusters.models import HealthResult
    from recipes.models import Endpoint, EndpointSample, ModelVersion, Run, RunMetric, RunStatus

    empty = alice_web.get("/").content.decode()
    for invitation in ("Nothing is training", "No model registered yet", "register one first"):
        assert invitation in empty  # each empty section says what to do next
    scan = Operation.objects.create(cluster=demo, kind="SCAN", status=OperationStatus.SUCCEEDED)
    HealthResult.objects.create(operation=scan, cluster=demo, node="cpu-1", check_name="gpu", status="fail",
                                latest=True)  # fmt: skip
    run = Run.objects.create(cluster=demo, recipe_id="llama3.1-8b-pretrain", profile="tiny", partition="cpu",
                             nodes=1, steps=100, config={}, script="", work_dir="/home/runs/x",
                             status=RunStatus.RUNNING)  # fmt: skip
    RunMetric.objects.create(run=run, line=0, step=40, values={"step": 40, "loss": 2.5, "time": 1.0})
    ModelVersion.objects.create(project=demo.project, name="llama", version=3, family="llama", checkpoint="x",
                                step=60, final_loss=1.25)  # fmt: skip
    endpoint = Endpoint.objects.create(project=demo.project, cluster=demo, name="chat", model_name="llama",
                                       version=3, created=timezone.now() - timedelta(minutes=10))  # fmt: skip
    EndpointSample.objects.create(endpoint=endpoint, time=timezone.now(), seconds=5, requests=30, errors=2)

    page = alice_web.get("/").content.decode()
    assert "1 node failing checks" in page
    assert run.get_absolute_url() in page and 'aria-valuenow="40"' in page and "2.500" in page
    assert "llama v3" in page and "1.250" in page
    assert endpoint.get_absolute_url() in page and "0.10" in page  # 30 requests over 5 minutes
    client.force_login(charlie)
    theirs = client.get("/").content.decode()
    assert "demo" not in theirs and "llama" not in theirs and "/endpoints/alpha/" not in theirs


def test_it_creates_a_cluster_from_the_form(alice_web):
    import json

    response = alice_web.post(
        "/clusters/new/", {"project": "alpha", "cluster_id": "web", "spec": json.dumps(example_spec())}
    )
    assert response.status_code == 302
    assert response["Location"] == "/clusters/alpha/web/"
    assert Cluster.objects.get().name == "web"


def test_it_shows_form_errors_with_field_paths_and_keeps_the_input(alice_web):
    import json

    spec = example_spec()
    spec["node_pools"][1]["zone"] = "us-east1-b"
    text = json.dumps(spec)
    response = alice_web.post("/clusters/new/", {"project": "alpha", "cluster_id": "web", "spec": text})
    assert response.status_code == 400
    content = response.content.decode()
    assert "all node pools must be in one zone" in content
    assert "us-east1-b" in content  # the user's spec is still in the textarea
    assert not Cluster.objects.exists()


def test_it_reports_broken_json_in_the_form(alice_web):
    response = alice_web.post("/clusters/new/", {"project": "alpha", "cluster_id": "web", "spec": "{oops"})
    assert response.status_code == 400
    assert b"not valid JSON" in response.content


def test_it_shows_alice_her_cluster_page(alice_web, demo):
    content = alice_web.get("/clusters/alpha/demo/").content.decode()
    assert "demo" in content
    assert 'hx-get="/clusters/alpha/demo/operation/"' in content
    assert "of 8 vCPUs" in content  # how the local backend scales each node down


def test_charlie_gets_404_for_alices_cluster_page_and_fragments(client, charlie, charlies_project, demo):
    client.force_login(charlie)
    for suffix in ("", "operation/", "nodes/", "jobs/", "events/"):
        assert client.get(f"/clusters/alpha/demo/{suffix}").status_code == 404
    assert client.post("/clusters/alpha/demo/delete/", {"confirm": "demo"}).status_code == 404


def test_it_polls_the_operation_until_it_is_done(alice_web, demo):
    running = alice_web.get("/clusters/alpha/demo/operation/", HTTP_HX_REQUEST="true")
    assert running.status_code == 200
    assert b"waiting for a worker" in running.content
    assert b"<strong>Create</strong>" in running.content  # the kind's label, from the engine's registry
    Operation.objects.update(status=OperationStatus.SUCCEEDED, progress=100)
    finished = alice_web.get("/clusters/alpha/demo/operation/", HTTP_HX_REQUEST="true")
    assert finished.status_code == 286  # htmx stops polling
    assert b"100%" in finished.content
    assert "HX-Request" in finished["Vary"]


def test_it_refuses_a_delete_without_confirmation(alice_web, demo):
    provisioned()
    response = alice_web.post("/clusters/alpha/demo/delete/", {"confirm": "wrong"}, follow=True)
    assert b"to confirm deletion" in response.content
    assert Cluster.objects.get().status == ClusterStatus.READY


def test_it_rejects_a_negative_resize_in_the_form(alice_web, demo):
    provisioned()
    response = alice_web.post("/clusters/alpha/demo/resize/", {"node_pool": "cpu", "node_count": "-1"}, follow=True)
    assert b"node count of 0 or more" in response.content
    assert Operation.objects.count() == 1


def test_it_shows_a_new_token_once_and_stores_only_its_digest(alice_web, alice):
    response = alice_web.post("/tokens/", {"name": "laptop"})
    secret = response.context["new_secret"]
    assert secret.startswith("tcc_")
    assert secret.encode() in response.content
    token = APIToken.objects.get(user=alice)
    assert token.digest == digest(secret)
    assert secret not in str(APIToken.objects.values().get())
    assert secret.encode() not in alice_web.get("/tokens/").content


def test_it_refuses_a_deeply_nested_spec_in_the_form(alice_web):
    spec = "[" * 5000 + "]" * 5000
    response = alice_web.post("/clusters/new/", {"project": "alpha", "cluster_id": "web", "spec": spec})
    assert response.status_code == 400
    assert b"nested deeper than 32 levels" in response.content
