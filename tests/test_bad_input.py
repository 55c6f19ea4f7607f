"""Bad input on every surface: a 400 in the surface's own shape naming the field, never a 500, and
nothing created. alice sends it; the spec fuzz replaces every value of the shipped examples in turn."""

import copy
import json
from pathlib import Path

import pytest
from django.conf import settings

from clusters.models import Cluster, Operation

from .conftest import example_spec, provisioned

pytestmark = pytest.mark.django_db

API = "/api/v1/projects/alpha/clusters/"
COMPAT = "/v1beta1/projects/alpha/locations/us-central1/modelDevelopmentClusters"
SERVICE_EXAMPLE = Path(settings.BASE_DIR) / "examples" / "service-create-a3ultra.json"
WRONG = [None, 0, -1, 10**30, 1.5, True, "", "x", "x\n", [], [1], {}, {"a": 1}]


def paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*prefix, index))


def replaced(value, path, new):
    value = copy.deepcopy(value)
    target = value
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return value


def mutations(spec):
    for path in paths(spec):
        if path:
            for new in WRONG:
                yield path, replaced(spec, path, new)


@pytest.mark.parametrize(
    "spec", [example_spec(), json.loads(SERVICE_EXAMPLE.read_text())], ids=["local-example", "a3ultra-example"]
)
def test_it_answers_every_wrong_value_anywhere_in_the_spec_without_a_server_error(alice_api, spec):
    answers = {}
    for path, bad in mutations(spec):
        response = alice_api.post(API + "?dry_run=true", {"cluster_id": "fuzz", "spec": bad}, format="json")
        answers.setdefault(response.status_code, []).append(path)
        assert response.status_code in (200, 400), (path, response.status_code, response.content[:300])
    assert len(answers[400]) > 100
    assert not Cluster.objects.exists()


def test_it_refuses_ids_with_a_trailing_newline(alice_api):
    response = alice_api.post(API, {"cluster_id": "demo\n", "spec": example_spec()}, format="json")
    assert response.status_code == 400
    assert response.json()["cluster_id"]
    spec = example_spec()
    spec["node_pools"][1]["id"] = "cpu\n"
    spec["orchestrator_spec"]["slurm_spec"]["partitions"][0]["node_pool_ids"] = ["cpu\n"]
    assert "node_pools[1].id" in alice_api.post(API, {"cluster_id": "demo", "spec": spec}, format="json").json()["spec"]
    response = alice_api.post(f"{COMPAT}?model_development_cluster_id=demo%0A", example_spec(), format="json")
    assert response.status_code == 400
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert not Cluster.objects.exists()


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_it_refuses_nan_and_infinity_on_both_apis(alice_api, constant):
    spec = json.dumps(example_spec()).replace('"min_node_count": 2', f'"min_node_count": {constant}')
    body = '{"cluster_id": "demo", "spec": ' + spec + "}"
    response = alice_api.post(API, body, content_type="application/json")
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["detail"]
    response = alice_api.post(f"{COMPAT}?model_development_cluster_id=demo", spec, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert not Cluster.objects.exists()


def test_it_bounds_node_counts_and_boot_disks(alice_api):
    spec = example_spec(cpu=10**6)
    spec["node_pools"][0]["boot_disk"] = {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": 10**7}
    errors = alice_api.post(API, {"cluster_id": "demo", "spec": spec}, format="json").json()["spec"]
    assert errors["node_pools[1].scaling_spec.min_node_count"] == ["must be at most 10,000"]
    assert errors["node_pools[0].boot_disk.boot_disk_size_gb"] == ["must be at most 65,536"]


def test_it_counts_the_login_pool_against_the_local_node_limit_and_the_quota(alice_api, alpha):
    response = alice_api.post(API, {"cluster_id": "demo", "spec": example_spec(login=50)}, format="json")
    assert response.status_code == 400
    assert "one login node" in response.json()["spec"]["node_pools[0].scaling_spec"][0]
    alpha.node_quota = 2
    alpha.save()
    response = alice_api.post(API, {"cluster_id": "demo", "spec": example_spec(cpu=2)}, format="json")
    assert response.status_code == 403
    assert "Nodes: the project's quota is 2, its clusters use 0, this asks for 3" in response.json()["detail"]
    assert not Cluster.objects.exists()


@pytest.mark.parametrize(
    "path",
    [
        "/slurm/v0.0.38/jobs\n",
        "/slurm/v0.0.38/job/1\x00",
        "/slurm/v0.0.38/%2e%2e/%2e%2e/etc/passwd",
        "/slurm/v0.0.38/../../etc",
        "/slurm/v0.0.38/jobs%0A",
        "/slurm//v0.0.38/jobs",
        "/etc/passwd",
        ["/slurm/"],
    ],
)
def test_it_refuses_slurmrestd_paths_with_control_characters_or_encoded_dots(alice_api, path):
    alice_api.post(API, {"cluster_id": "demo", "spec": example_spec()}, format="json")
    provisioned(name="demo")
    response = alice_api.post(
        f"{COMPAT}/demo:callSlurmRestApi", {"method": "HTTP_METHOD_GET", "path": path}, format="json"
    )
    assert response.status_code == 400
    violations = response.json()["error"]["details"][0]["fieldViolations"]
    assert [v["field"] for v in violations] == ["path"]


def test_it_refuses_an_uploaded_spec_file_over_the_cap(client, alice, alpha, settings):
    from django.core.files.uploadedfile import SimpleUploadedFile

    settings.JSON_MAX_BYTES = 1000
    client.force_login(alice)
    big = SimpleUploadedFile("spec.json", b'{"display_name": "' + b"x" * 5000 + b'"}', "application/json")
    response = client.post("/clusters/wizard/upload/", {"project": "alpha", "cluster_id": "up", "spec_file": big})
    assert response.status_code == 400  # the start page again, with the form error
    assert b"larger than the limit of 1,000 bytes" in response.content
    assert not Cluster.objects.exists()


def test_it_refuses_a_request_body_over_the_cap_before_reading_it(client, alice, alpha, settings):
    settings.REQUEST_MAX_BYTES = 10_000
    client.force_login(alice)
    big = b"x" * 20_000
    response = client.post("/clusters/wizard/upload/", data=big, content_type="multipart/form-data; boundary=zzz")
    assert response.status_code == 413
    assert b"larger than 10,000 bytes" in response.content
    assert not Operation.objects.exists()


def test_it_bounds_scan_overrides_that_would_tie_up_a_worker():
    from clusters.health import threshold_errors

    errors = threshold_errors(
        {"speed": {"seconds": 10**9, "size": 256}, "interconnect": {"timeout_seconds": 86_400, "megabytes": 4}}
    )
    assert errors == {
        "thresholds.speed.seconds": ["must be at most 60 (a bigger value would tie up the scan's worker and nodes)"],
        "thresholds.interconnect.timeout_seconds": [
            "must be at most 1,800 (a bigger value would tie up the scan's worker and nodes)"
        ],
    }
    assert threshold_errors({"speed": {"seconds": 5}, "correctness": {"rounds": 10}}) == {}
