"""The console's REST API: validation, conflicts and who may see what (no worker runs here)."""

import re

import pytest

from clusters.choices import ClusterStatus, NodeState, OperationStatus
from clusters.models import Cluster, Operation

from .conftest import example_spec, provisioned

pytestmark = pytest.mark.django_db

CLUSTERS = "/api/v1/projects/alpha/clusters/"


def create(client, cluster_id="demo", spec=None):
    return client.post(CLUSTERS, {"cluster_id": cluster_id, "spec": spec or example_spec()}, format="json")


def test_it_creates_a_cluster_and_enqueues_one_operation(alice_api, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = create(alice_api)
    assert response.status_code == 202
    assert response.json()["kind"] == "CREATE"
    assert response.json()["status"] == "PENDING"
    assert len(callbacks) == 1
    cluster = Cluster.objects.get(name="demo")
    assert cluster.status == ClusterStatus.PROVISIONING
    assert cluster.location == "us-central1"
    assert sorted(cluster.nodes.values_list("name", flat=True)) == ["cpu-0", "cpu-1", "login-0"]
    assert list(cluster.partitions.values_list("name", flat=True)) == ["cpu"]


def test_it_answers_400_with_field_paths_and_creates_nothing(alice_api):
    spec = example_spec()
    spec["display_name"] = "Not Valid"
    spec["node_pools"][1]["scaling_spec"]["max_node_count"] = 5
    response = create(alice_api, cluster_id="Bad Id", spec=spec)
    assert response.status_code == 400
    body = response.json()
    assert "cluster_id" in body
    assert set(body["spec"]) == {"display_name", "node_pools[1].scaling_spec"}
    assert not Cluster.objects.exists()
    assert not Operation.objects.exists()


def test_it_answers_400_for_a_missing_spec_and_for_broken_json(alice_api):
    response = alice_api.post(CLUSTERS, {"cluster_id": "demo"}, format="json")
    assert response.status_code == 400
    assert "spec" in response.json()
    response = alice_api.post(CLUSTERS, "{not json", content_type="application/json")
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]


def test_it_refuses_a_second_cluster_with_the_same_id(alice_api):
    assert create(alice_api).status_code == 202
    response = create(alice_api)
    assert response.status_code == 409
    assert "already exists" in response.json()["detail"]


def test_it_frees_the_id_of_a_deleted_cluster(alice_api):
    create(alice_api)
    Cluster.objects.filter(name="demo").update(status=ClusterStatus.DELETED)
    assert create(alice_api).status_code == 202


def test_it_lets_bob_see_and_change_alices_cluster_in_their_project(alice_api, bob_api):
    create(alice_api)
    assert bob_api.get(CLUSTERS).json()["results"][0]["id"] == "demo"
    provisioned(name="demo")
    response = bob_api.patch(f"{CLUSTERS}demo/", {"spec": example_spec(cpu=3)}, format="json")
    assert response.status_code == 202
    assert response.json()["kind"] == "UPDATE"


def test_charlie_gets_404_for_alices_project_and_cluster(alice_api, charlie_api):
    create(alice_api)
    assert charlie_api.get(CLUSTERS).status_code == 404
    assert charlie_api.get(f"{CLUSTERS}demo/").status_code == 404
    assert charlie_api.patch(f"{CLUSTERS}demo/", {"spec": example_spec()}, format="json").status_code == 404
    assert charlie_api.delete(f"{CLUSTERS}demo/").status_code == 404
    assert create(charlie_api, cluster_id="mine").status_code == 404
    operation = Operation.objects.get()
    assert charlie_api.get(f"/api/v1/projects/alpha/operations/{operation.uuid}/").status_code == 404
    assert [p["slug"] for p in charlie_api.get("/api/v1/projects/").json()["results"]] == ["charlie-lab"]
    assert Cluster.objects.get().status == ClusterStatus.PROVISIONING


def test_it_answers_401_without_a_valid_token(alpha, client):
    from rest_framework.test import APIClient

    anonymous = APIClient()
    assert anonymous.get(CLUSTERS).status_code == 401
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer tcc_not-a-real-token")
    assert anonymous.get(CLUSTERS).status_code == 401


def test_it_resizes_only_node_counts(alice_api):
    create(alice_api)
    provisioned(name="demo")
    spec = example_spec(cpu=3)
    spec["node_pools"][1]["machine_spec"]["machine_type"] = "n2-standard-16"
    response = alice_api.patch(f"{CLUSTERS}demo/", {"spec": spec}, format="json")
    assert response.status_code == 400
    assert response.json()["spec"] == {
        "node_pools[1].machine_spec.machine_type": ["cannot change after the cluster is created"]
    }
    assert Cluster.objects.get().status == ClusterStatus.READY
    # An empty field left out, or sent empty, is no change: the same spec, resized, is accepted.
    spec = example_spec(cpu=3)
    spec["orchestrator_spec"]["slurm_spec"]["prolog_bash_scripts"] = []
    assert alice_api.patch(f"{CLUSTERS}demo/", {"spec": spec}, format="json").status_code == 202


def test_it_marks_the_highest_nodes_for_removal_when_shrinking(alice_api):
    create(alice_api, spec=example_spec(cpu=3))
    provisioned(name="demo")
    response = alice_api.patch(f"{CLUSTERS}demo/", {"spec": example_spec(cpu=1)}, format="json")
    assert response.status_code == 202
    cluster = Cluster.objects.get()
    assert cluster.status == ClusterStatus.UPDATING
    assert list(cluster.nodes.filter(state=NodeState.DELETING).values_list("name", flat=True)) == ["cpu-1", "cpu-2"]


def test_it_refuses_to_update_or_delete_while_provisioning(alice_api):
    create(alice_api)
    response = alice_api.patch(f"{CLUSTERS}demo/", {"spec": example_spec(cpu=3)}, format="json")
    assert response.status_code == 409
    assert alice_api.delete(f"{CLUSTERS}demo/").status_code == 409
    assert Operation.objects.count() == 1


def test_it_deletes_a_ready_cluster_through_an_operation(alice_api):
    create(alice_api)
    provisioned(name="demo")
    response = alice_api.delete(f"{CLUSTERS}demo/")
    assert response.status_code == 202
    assert response.json()["kind"] == "DELETE"
    assert Cluster.objects.get().status == ClusterStatus.DELETING


def test_it_shows_an_operation_to_project_members(alice_api, bob_api):
    operation_id = create(alice_api).json()["id"]
    body = bob_api.get(f"/api/v1/projects/alpha/operations/{operation_id}/").json()
    assert body["status"] == OperationStatus.PENDING
    assert body["cluster"] == "demo"


def test_it_serves_the_openapi_schema_and_swagger_ui_to_signed_in_users(alice_api, client, alice):
    from rest_framework.test import APIClient

    assert APIClient().get("/api/schema/").status_code == 401
    schema = alice_api.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/projects/{project}/clusters/" in schema.content
    client.force_login(alice)
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content
    # Served from our own static files, never a CDN (the page's random CSRF token once held "cdn" by chance:
    # look at the addresses the page loads, not at every byte of it).
    loads = re.findall(rb'(?:src|href)="([^"]*)"', docs.content)
    assert loads and all(url.startswith(b"/static/") for url in loads), loads


def test_it_refuses_huge_and_absurdly_nested_bodies_with_a_clear_message(alice_api):
    deep = '{"cluster_id": "x", "spec": ' + "[" * 1000 + "]" * 1000 + "}"
    response = alice_api.post(CLUSTERS, deep, content_type="application/json")
    assert response.status_code == 400
    assert "nested deeper than 32 levels" in response.json()["detail"]
    spec = example_spec()
    spec["labels"] = {"padding": "x" * 1_500_000}
    response = alice_api.post(CLUSTERS, {"cluster_id": "big", "spec": spec}, format="json")
    assert response.status_code == 400
    assert "larger than the limit of 1,000,000 bytes" in response.json()["detail"]
    spec["labels"] = {"padding": "x" * 10_000_000}
    response = alice_api.post(CLUSTERS, {"cluster_id": "big", "spec": spec}, format="json")
    assert response.status_code == 413
    assert "Request body refused" in response.json()["detail"]
    assert not Cluster.objects.exists()


def test_it_refuses_a_cluster_over_the_projects_quota(alice_api, alpha):
    alpha.node_quota = 5  # login nodes count: each cluster here is 1 login + its cpu nodes
    alpha.save()
    assert create(alice_api, "first", example_spec(cpu=2)).status_code == 202
    response = create(alice_api, "second", example_spec(cpu=2))
    assert response.status_code == 403
    assert response.json()["detail"] == (
        "Quota exceeded: Nodes: the project's quota is 5, its clusters use 3, this asks for 3"
    )
    assert create(alice_api, "third", example_spec(cpu=1)).status_code == 202


def test_it_answers_429_with_retry_after_once_alice_passes_her_reads_and_keeps_her_writes_apart(
    alice_api, bob_api, settings
):
    from django.core.cache import cache

    cache.clear()
    settings.API_READS_PER_MINUTE, settings.API_WRITES_PER_MINUTE = 5, 2
    for _ in range(5):
        assert alice_api.get(CLUSTERS).status_code == 200
    refused = alice_api.get(CLUSTERS)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert bob_api.get(CLUSTERS).status_code == 200  # counted per user
    # Writes have their own budget: the polling above did not use it up.
    assert create(alice_api, "first").status_code == 202
    assert create(alice_api, "second").status_code == 202
    assert create(alice_api, "third").status_code == 429
    assert not Cluster.objects.filter(name="third").exists()
    # The service's paths answer as Google does.
    answer = alice_api.get("/v1beta1/projects/alpha/locations/us-central1/modelDevelopmentClusters")
    assert answer.status_code == 429
    error = answer.json()["error"]
    assert (error["code"], error["status"]) == (429, "RESOURCE_EXHAUSTED")
    assert error["details"][0]["@type"] == "type.googleapis.com/google.rpc.RetryInfo"
    assert int(answer["Retry-After"]) >= 1


def test_listing_clusters_reads_each_clusters_latest_operation_in_one_query(alice_api, django_assert_max_num_queries):
    for n in range(12):
        assert create(alice_api, f"c{n:02}").status_code == 202
    provisioned(project__slug="alpha")
    with django_assert_max_num_queries(10):  # it was 6 + one per cluster
        listed = alice_api.get(CLUSTERS)
    assert listed.status_code == 200
    assert [c["latest_operation"]["kind"] for c in listed.json()["results"]] == ["CREATE"] * 12
    assert all(c["latest_operation"]["cluster"] == c["id"] for c in listed.json()["results"])


def test_it_lists_a_projects_clusters_a_page_at_a_time_by_name(alice_api, django_assert_max_num_queries):
    for n in (3, 0, 4, 1, 2):
        assert create(alice_api, f"c{n}").status_code == 202
    with django_assert_max_num_queries(10):
        first = alice_api.get(CLUSTERS, {"limit": 2}).json()
    assert (first["count"], [c["id"] for c in first["results"]]) == (5, ["c0", "c1"])
    second = alice_api.get(first["next"]).json()
    assert [c["id"] for c in second["results"]] == ["c2", "c3"]
    assert all(c["latest_operation"]["kind"] == "CREATE" for c in second["results"])
    last = alice_api.get(second["next"]).json()
    assert ([c["id"] for c in last["results"]], last["next"]) == (["c4"], None)
    assert len(alice_api.get(CLUSTERS).json()["results"]) == 5  # 100 to a page unless asked


def test_it_answers_400_for_a_page_it_cannot_read(alice_api):
    create(alice_api)
    for query in ({"limit": "abc"}, {"limit": 0}, {"limit": 1001}, {"offset": -1}):
        answer = alice_api.get(CLUSTERS, query)
        assert answer.status_code == 400, query
        assert set(answer.json()) == set(query)


def test_a_token_records_its_last_use_to_the_minute_not_on_every_request(alice, alpha):
    from datetime import timedelta

    from rest_framework.test import APIClient

    from console.models import APIToken

    token, raw = APIToken.issue(alice, "script")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get(CLUSTERS).status_code == 200
    first = APIToken.objects.get(pk=token.pk).last_used
    assert first is not None
    assert client.get(CLUSTERS).status_code == 200
    assert APIToken.objects.get(pk=token.pk).last_used == first  # no write for a second use that minute
    APIToken.objects.filter(pk=token.pk).update(last_used=first - timedelta(minutes=2))
    assert client.get(CLUSTERS).status_code == 200
    assert APIToken.objects.get(pk=token.pk).last_used > first
