"""Roles per project, checked in one place for pages, /api/v1, v1beta1 and the proxies; API tokens
narrowed to a project, to reads, and to a last day.

alice is an admin of "alpha", olga an operator there, victor a viewer; charlie is an outsider.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.choices import ClusterStatus, Role
from clusters.models import Cluster, Operation, Project
from clusters.operations import engine
from console.models import APIToken

from .conftest import api_client_for, example_spec, provisioned

pytestmark = pytest.mark.django_db

CLUSTERS = "/api/v1/projects/alpha/clusters/"
COMPAT = "/v1beta1/projects/alpha/locations/us-central1/modelDevelopmentClusters"


@pytest.fixture
def olga(django_user_model, alpha):
    user = django_user_model.objects.create_user("olga", "olga@example.com", "olga-password")
    alpha.members.add(user, through_defaults={"role": Role.OPERATOR})
    return user


@pytest.fixture
def victor(django_user_model, alpha):
    user = django_user_model.objects.create_user("victor", "victor@example.com", "victor-password")
    alpha.members.add(user)  # a plain add makes a viewer
    return user


@pytest.fixture
def demo(alice_api):
    assert alice_api.post(CLUSTERS, {"cluster_id": "demo", "spec": example_spec()}, format="json").status_code == 202
    provisioned(name="demo")
    return Cluster.objects.get(name="demo")


def test_victor_the_viewer_reads_everything_and_changes_nothing(victor, demo):
    api = api_client_for(victor)
    assert api.get(CLUSTERS).status_code == 200
    assert api.get(f"{CLUSTERS}demo/").status_code == 200
    assert api.get(f"{CLUSTERS}demo/events/").status_code == 200
    assert api.get(f"{COMPAT}/demo").status_code == 200
    before = Operation.objects.count()
    refused = [
        api.post(CLUSTERS, {"cluster_id": "mine", "spec": example_spec()}, format="json"),
        api.patch(f"{CLUSTERS}demo/", {"spec": example_spec(cpu=3)}, format="json"),
        api.delete(f"{CLUSTERS}demo/"),
        api.post(f"{CLUSTERS}demo/scans/", {}, format="json"),
        api.patch(f"{CLUSTERS}demo/health/schedule/", {"enabled": False}, format="json"),
        api.post(f"{CLUSTERS}demo/runs/", {"recipe": "llama3.1-8b-pretrain"}, format="json"),
    ]
    for response in refused:
        assert response.status_code == 403, response.content
        assert response.json()["detail"].startswith("Your role in project 'alpha' is viewer; this needs ")
    assert "needs admin (modelDevelopmentClusters.delete)" in refused[2].json()["detail"]
    assert "needs operator (modelDevelopmentClusters.run)" in refused[3].json()["detail"]
    assert Operation.objects.count() == before
    assert list(Cluster.objects.values_list("name", flat=True)) == ["demo"]


def test_victor_gets_permission_denied_on_the_service_paths(victor, demo):
    api = api_client_for(victor)
    answers = [
        api.post(f"{COMPAT}?model_development_cluster_id=mine", example_spec(), format="json"),
        api.patch(f"{COMPAT}/demo", example_spec(cpu=3), format="json"),
        api.delete(f"{COMPAT}/demo"),
        api.post(f"{COMPAT}/demo:callSlurmRestApi", {"method": "HTTP_METHOD_GET", "path": "/slurm/v0.0.38/jobs"}),
    ]
    for response in answers:
        assert response.status_code == 403
        assert response.json()["error"]["status"] == "PERMISSION_DENIED"
    assert Cluster.objects.get(name="demo").status == ClusterStatus.READY


def test_victor_gets_a_403_page_for_actions_and_sees_the_cluster_page(client, victor, demo):
    client.force_login(victor)
    assert client.get("/clusters/alpha/demo/").status_code == 200
    response = client.post("/clusters/alpha/demo/resize/", {"node_pool": "cpu", "node_count": 3})
    assert response.status_code == 403
    assert b"Your role in project &#x27;alpha&#x27; is viewer" in response.content
    assert client.post("/clusters/alpha/demo/delete/", {"confirm": "demo"}).status_code == 403
    assert client.get("/clusters/alpha/demo/runs/new/").status_code == 403
    assert Cluster.objects.get(name="demo").status == ClusterStatus.READY


def test_olga_the_operator_runs_things_but_does_not_resize_or_delete(olga, demo):
    api = api_client_for(olga)
    response = api.post(f"{CLUSTERS}demo/scans/", {"checks": ["vibes"]}, format="json")
    assert response.status_code == 400  # past the role check, stopped by the request's own checks
    assert "unknown check 'vibes'" in response.json()["checks"][0]
    assert api.patch(f"{CLUSTERS}demo/", {"spec": example_spec(cpu=3)}, format="json").status_code == 403
    assert api.delete(f"{CLUSTERS}demo/").status_code == 403
    assert api.post(CLUSTERS, {"cluster_id": "mine", "spec": example_spec()}, format="json").status_code == 403


def test_charlie_the_outsider_still_gets_404_not_403(charlie_api, demo):
    assert charlie_api.get(f"{CLUSTERS}demo/").status_code == 404
    assert charlie_api.delete(f"{CLUSTERS}demo/").status_code == 404
    assert charlie_api.get(f"{COMPAT}/demo").json()["error"]["status"] == "PERMISSION_DENIED"


def test_a_read_only_token_reads_but_never_writes_even_for_an_admin(alice, demo):
    from rest_framework.test import APIClient

    _token, raw = APIToken.issue(alice, "dashboards", read_only=True)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get(f"{CLUSTERS}demo/").status_code == 200
    response = api.delete(f"{CLUSTERS}demo/")
    assert response.status_code == 403
    assert "is viewer (this API token is read-only)" in response.json()["detail"]
    assert api.delete(f"{COMPAT}/demo").json()["error"]["status"] == "PERMISSION_DENIED"
    assert Cluster.objects.get(name="demo").status == ClusterStatus.READY


def test_a_project_token_reaches_only_its_project(alice, alpha, demo):
    from rest_framework.test import APIClient

    beta = Project.objects.create(slug="beta", name="Beta")
    beta.members.add(alice, through_defaults={"role": Role.ADMIN})
    _token, raw = APIToken.issue(alice, "alpha-ci", project=alpha)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert [p["slug"] for p in api.get("/api/v1/projects/").json()["results"]] == ["alpha"]
    assert api.get(CLUSTERS).status_code == 200
    assert api.get("/api/v1/projects/beta/clusters/").status_code == 404
    beta_create = api.post(
        "/api/v1/projects/beta/clusters/", {"cluster_id": "b", "spec": example_spec()}, format="json"
    )
    assert beta_create.status_code == 404
    assert not Cluster.objects.filter(project=beta).exists()


def test_an_expired_token_is_refused(alice, demo):
    from rest_framework.test import APIClient

    token, raw = APIToken.issue(alice, "old", expires=timezone.now() + timedelta(days=1))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get(CLUSTERS).status_code == 200
    APIToken.objects.filter(pk=token.pk).update(expires=timezone.now() - timedelta(seconds=1))
    response = api.get(CLUSTERS)
    assert response.status_code == 401
    assert response.json()["detail"] == "Invalid, expired or revoked token."
    assert api.get(f"{COMPAT}/demo").json()["error"]["status"] == "UNAUTHENTICATED"


def test_it_issues_scoped_tokens_from_the_tokens_page(client, alice, alpha):
    client.force_login(alice)
    response = client.post("/tokens/", {"name": "ci", "project": "alpha", "read_only": "on", "expires_days": "30"})
    assert response.status_code == 200
    token = APIToken.objects.get(name="ci")
    assert (token.project, token.read_only) == (alpha, True)
    assert timedelta(days=29) < token.expires - timezone.now() <= timedelta(days=30)
    assert client.post("/tokens/", {"name": "x", "project": "beta"}).status_code == 400
    assert client.post("/tokens/", {"name": "y", "expires_days": "9999"}).status_code == 400
    assert APIToken.objects.count() == 1


def test_fault_actions_in_the_admin_need_their_own_permission(client, django_user_model, demo):
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user("sam", "sam@example.com", "sam-password", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_node"))
    client.force_login(staff)
    page = client.get("/admin/clusters/node/")
    assert page.status_code == 200
    assert b"inject_" not in page.content
    staff.user_permissions.add(Permission.objects.get(codename="inject_faults"))
    assert b"inject_" in client.get("/admin/clusters/node/").content


def test_alice_manages_members_and_a_project_keeps_its_last_admin(alice_api, olga, victor, bob):
    members = "/api/v1/projects/alpha/members/"
    listed = {m["username"]: m["role"] for m in api_client_for(victor).get(members).json()}
    assert listed == {"alice": "admin", "bob": "admin", "olga": "operator", "victor": "viewer"}
    assert alice_api.put(members, {"username": "victor", "role": "operator"}, format="json").status_code == 200
    response = api_client_for(victor).put(members, {"username": "victor", "role": "admin"}, format="json")
    assert response.status_code == 403
    bad = alice_api.put(members, {"username": "nobody", "role": "owner"}, format="json")
    assert bad.status_code == 400
    assert set(bad.json()) == {"username", "role"}
    assert alice_api.delete(f"{members}bob/").status_code == 204
    last = alice_api.put(members, {"username": "alice", "role": "viewer"}, format="json")
    assert last.status_code == 409
    assert "last admin" in last.json()["detail"]
    assert alice_api.delete(f"{members}alice/").status_code == 409
    roles = dict(Project.objects.get(slug="alpha").memberships.values_list("user__username", "role"))
    assert roles == {"alice": "admin", "olga": "operator", "victor": "operator"}


def test_the_cluster_page_offers_only_what_the_role_allows(client, alice, victor, olga, demo):
    client.force_login(victor)
    page = client.get("/clusters/alpha/demo/").content.decode()
    assert "Viewer" in page
    for action in ("Delete cluster", ">Resize<", "Launch a recipe", "Run health scan", ">Duplicate<"):
        assert action not in page
    client.force_login(olga)
    page = client.get("/clusters/alpha/demo/").content.decode()
    assert "Launch a recipe" in page and "Delete cluster" not in page
    client.force_login(alice)
    page = client.get("/clusters/alpha/demo/").content.decode()
    assert "Delete cluster" in page and ">Resize<" in page and "Launch a recipe" in page


def test_only_an_admin_rotates_a_clusters_certificate_and_not_while_it_is_busy(alice_api, olga, charlie_api, demo):
    """Alice suspects the controller's key leaked and rotates it through the API: 202 with the operation (a
    worker runs it; tests/test_slurm_rest.py checks what it does). Olga the operator gets 403, charlie 404;
    a second rotation while the first holds the cluster is a 409; a reason that is not a short string a 400."""
    rotate = f"{CLUSTERS}demo/certificate/rotate/"
    assert api_client_for(olga).post(rotate).status_code == 403
    assert charlie_api.post(rotate).status_code == 404
    assert alice_api.post(rotate, {"reason": ["no"]}, format="json").json() == {
        "reason": ["a string of at most 200 characters"]
    }
    response = alice_api.post(rotate, {"reason": "key seen in a job log"}, format="json")
    assert response.status_code == 202 and response.json()["kind"] == "ROTATE_TLS"
    operation = Operation.objects.get(uuid=response.json()["id"])
    assert operation.created_by.username == "alice"
    assert demo.events.filter(message="Rotating the controller's certificate: key seen in a job log").exists()
    assert alice_api.post(rotate).status_code == 409
    # This cluster's test backend reaches no controller: the rotation fails at once, saying so, not retried.
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == "FAILED" and operation.attempts == 1
    assert "there is no controller certificate to rotate" in operation.error
