"""The managed service's v1beta1 paths: operations, google.rpc errors, paging and access."""

import pytest
from rest_framework.test import APIClient

from clusters.choices import ClusterStatus, OperationStatus
from clusters.models import Cluster, Operation

from .conftest import example_spec, provisioned
from .factories import BASE, create, service_example

pytestmark = pytest.mark.django_db


def test_it_answers_a_create_with_a_long_running_operation(alice_api):
    response = create(alice_api)
    assert response.status_code == 200
    body = response.json()
    assert body["name"].startswith("projects/alpha/locations/us-central1/operations/")
    assert body["metadata"]["@type"].endswith("CreateModelDevelopmentClusterOperationMetadata")
    assert body["metadata"]["genericMetadata"]["createTime"].endswith("Z")
    assert body["metadata"]["progressMessage"] == "Waiting for a worker"
    assert "done" not in body
    cluster = Cluster.objects.get(name="a3u")
    assert cluster.spec["node_pools"][1]["machine_spec"]["accelerator_type"] == "NVIDIA_H200_141GB"


def test_it_polls_the_operation_by_its_name(alice_api):
    name = create(alice_api).json()["name"]
    response = alice_api.get(f"/v1beta1/{name}")
    assert response.status_code == 200
    assert response.json()["name"] == name


def test_it_reports_bad_fields_as_invalid_argument_with_field_violations(alice_api):
    body = service_example()
    body["node_pools"][1]["scaling_spec"]["max_node_count"] = 4
    body["node_pools"][1]["machine_spec"]["accelerator_count"] = 4
    response = create(alice_api, body=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert error["code"] == 400
    fields = {v["field"] for v in error["details"][0]["fieldViolations"]}
    assert fields == {"node_pools[1].scaling_spec", "node_pools[1].machine_spec.accelerator_count"}
    assert not Cluster.objects.exists()


def test_it_requires_the_cluster_id_and_a_matching_location(alice_api):
    response = alice_api.post(f"{BASE}/modelDevelopmentClusters", service_example(), format="json")
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"
    response = create(alice_api, location="europe-west4")
    assert response.status_code == 400
    assert "europe-west4" in response.json()["error"]["details"][0]["fieldViolations"][0]["description"]
    assert not Cluster.objects.exists()


def test_it_keeps_a_failed_clusters_id_until_it_is_deleted(alice_api):
    create(alice_api)
    Operation.objects.update(status=OperationStatus.FAILED)  # as if its create had failed
    Cluster.objects.update(status=ClusterStatus.FAILED)
    response = create(alice_api)
    assert response.status_code == 409
    assert response.json()["error"]["status"] == "ALREADY_EXISTS"
    assert alice_api.delete(f"{BASE}/modelDevelopmentClusters/a3u").status_code == 200
    Cluster.objects.update(status=ClusterStatus.DELETED)
    assert create(alice_api).status_code == 200


def test_it_accepts_camel_case_bodies_and_ignores_output_only_fields(alice_api):
    body = {
        "name": "projects/alpha/locations/us-central1/modelDevelopmentClusters/x",
        "state": "RUNNING",
        "displayName": "camel",
        "nodePools": [
            {
                "id": "login",
                "machineSpec": {"machineType": "n2-standard-4"},
                "scalingSpec": {"minNodeCount": 1, "maxNodeCount": 1},
                "zone": "us-central1-a",
            },
            {
                "id": "cpu",
                "machineSpec": {"machineType": "n2-standard-4"},
                "scalingSpec": {"minNodeCount": "2", "maxNodeCount": "2"},
                "zone": "us-central1-a",
            },
        ],
        "orchestratorSpec": {
            "slurmSpec": {"partitions": [{"id": "cpu", "nodePoolIds": ["cpu"]}], "loginNodePoolId": "login"}
        },
    }
    assert create(alice_api, cluster_id="camel", body=body).status_code == 200
    got = alice_api.get(f"{BASE}/modelDevelopmentClusters/camel").json()
    assert got["display_name"] == "camel"
    assert got["state"] == "PROVISIONING"
    assert got["name"] == "projects/alpha/locations/us-central1/modelDevelopmentClusters/camel"


def test_it_pages_the_cluster_list(alice_api):
    for i in range(3):
        spec = example_spec()
        spec["display_name"] = f"c{i}"
        assert create(alice_api, cluster_id=f"c{i}", body=spec).status_code == 200
    first = alice_api.get(f"{BASE}/modelDevelopmentClusters?pageSize=2").json()
    assert [c["display_name"] for c in first["clusters"]] == ["c0", "c1"]
    second = alice_api.get(f"{BASE}/modelDevelopmentClusters?pageSize=2&pageToken={first['nextPageToken']}").json()
    assert [c["display_name"] for c in second["clusters"]] == ["c2"]
    assert "nextPageToken" not in second
    bad = alice_api.get(f"{BASE}/modelDevelopmentClusters?pageToken=garbage")
    assert bad.status_code == 400
    assert bad.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_charlie_is_denied_without_learning_whether_the_project_exists(alice_api, charlie_api):
    create(alice_api)
    for response in (
        charlie_api.get(f"{BASE}/modelDevelopmentClusters"),
        charlie_api.get(f"{BASE}/modelDevelopmentClusters/a3u"),
        charlie_api.delete(f"{BASE}/modelDevelopmentClusters/a3u"),
        charlie_api.get("/v1beta1/projects/no-such-project/locations/us-central1/modelDevelopmentClusters"),
    ):
        assert response.status_code == 403
        assert response.json()["error"]["status"] == "PERMISSION_DENIED"
        assert "(or it may not exist)" in response.json()["error"]["message"]


def test_it_answers_unauthenticated_and_not_found_in_the_rpc_shape(alice_api, alpha):
    response = APIClient().get(f"{BASE}/modelDevelopmentClusters")
    assert response.status_code == 401
    assert response.json()["error"]["status"] == "UNAUTHENTICATED"
    for path in (
        "modelDevelopmentClusters/nope",
        "operations/not-a-uuid",
        "operations/6c1d4c1e-8d6f-4c1a-9d6e-1f2a3b4c5d6e",
    ):
        response = alice_api.get(f"{BASE}/{path}")
        assert response.status_code == 404
        assert response.json()["error"]["status"] == "NOT_FOUND"


def test_it_answers_broken_json_with_invalid_argument(alice_api):
    response = alice_api.post(
        f"{BASE}/modelDevelopmentClusters?model_development_cluster_id=x", "{oops", content_type="application/json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_it_updates_node_counts_with_patch(alice_api):
    create(alice_api)
    provisioned()
    body = service_example()
    body["node_pools"][1]["scaling_spec"] = {"min_node_count": 3, "max_node_count": 3}
    response = alice_api.patch(f"{BASE}/modelDevelopmentClusters/a3u", body, format="json")
    assert response.status_code == 200
    assert response.json()["metadata"]["@type"].endswith("UpdateModelDevelopmentClusterOperationMetadata")
    assert Cluster.objects.get().node_pools.get(pool_id="a3u").node_count == 3


def test_it_refuses_a_deeply_nested_body_as_invalid_argument(alice_api):
    response = alice_api.post(
        f"{BASE}/modelDevelopmentClusters?model_development_cluster_id=x",
        "[" * 2000 + "]" * 2000,
        content_type="application/json",
    )
    assert response.status_code == 400
    assert "nested deeper" in response.json()["error"]["message"]


def test_it_keeps_wizard_drafts_out_of_the_service_paths(alice_api, alice, alpha):
    from clusters import services

    services.create_draft(project=alpha, name="draft", spec=example_spec(), user=alice)
    assert alice_api.get(f"{BASE}/modelDevelopmentClusters").json()["clusters"] == []
    assert alice_api.get(f"{BASE}/modelDevelopmentClusters/draft").status_code == 404


def test_it_answers_a_repair_operation_with_its_metadata(alice_api, alpha, alice, scripted):
    from clusters.health import repair
    from clusters.operations import engine

    from .conftest import scripted_spec

    create_op = services_create(alpha, alice, scripted_spec())
    engine.run(create_op.pk)
    scripted.down.add("cpu-1")
    fix = repair.watch(Cluster.objects.get(name="ok"))
    response = alice_api.get(f"{BASE}/operations/{fix.uuid}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["metadata"]["@type"].endswith("GenericOperationMetadata")
    assert body["metadata"]["progressMessage"] == "Waiting for a worker"
    engine.run(fix.pk)
    done = alice_api.get(f"{BASE}/operations/{fix.uuid}").json()
    assert done["done"] is True and done["response"]["name"].endswith("/modelDevelopmentClusters/ok")


def services_create(project, user, spec):
    from clusters import services

    return services.create_cluster(project=project, name="ok", spec=spec, user=user)
