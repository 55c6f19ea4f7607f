"""schemathesis against the /api/v1 OpenAPI schema: zero server errors, zero schema violations.

alice (admin of "alpha", with a READY cluster "demo") sends every generated request; the example
count is bounded here (SCHEMATHESIS_EXAMPLES) and larger in benchmarks/schema_fuzz.py."""

import os

import pytest
import schemathesis
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import positive_data_acceptance

from clusters.api.compat_schema import document

from .conftest import api_client_for, example_spec, provisioned

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "10"))
# Every check but one: "a schema-valid request must be accepted" cannot hold for a cluster spec, whose
# validity is semantic (pools named in partitions, machine types, quota), not a JSON-schema shape; the
# spec validator's own fuzz test (test_bad_input.py) covers those bodies.
EXCLUDED = [positive_data_acceptance]


def api_schema():
    import django

    django.setup()
    return SchemaGenerator().get_schema(request=None, public=True)


schema = schemathesis.openapi.from_dict(api_schema())


REAL = {"project": "alpha", "location": "us-central1", "cluster": "demo"}
calls = iter(range(10**9))


def negative_at(case, location):
    return case.meta is not None and case.meta.is_negative_at(ParameterLocation[location])


def aimed(case):
    """Every other case at alice's real project and cluster, so bodies meet the real validators
    rather than a 404 for a random id (not a case whose path is the invalid part)."""
    if next(calls) % 2 and case.path_parameters and not negative_at(case, "PATH"):
        case.path_parameters.update({k: v for k, v in REAL.items() if k in case.path_parameters})
    return case


def token(case, raw):
    """alice's token, unless the case is about a missing or bad Authorization header."""
    return {} if negative_at(case, "HEADER") else {"Authorization": f"Bearer {raw}"}


@pytest.fixture
def alice_token(alice, alpha, transactional_db):
    from console.models import APIToken

    client = api_client_for(alice)
    client.post("/api/v1/projects/alpha/clusters/", {"cluster_id": "demo", "spec": example_spec()}, format="json")
    provisioned(name="demo")
    _token, raw = APIToken.issue(alice, "fuzz")
    return raw


@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_v1_answers_every_generated_request_within_its_schema(case, alice_token, live_server):
    aimed(case).call_and_validate(base_url=live_server.url, headers=token(case, alice_token), excluded_checks=EXCLUDED)


compat_schema = schemathesis.openapi.from_dict(document())


@pytest.mark.django_db(transaction=True)
@compat_schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_v1beta1_answers_every_generated_request_within_its_schema(case, alice_token, live_server):
    aimed(case).call_and_validate(base_url=live_server.url, headers=token(case, alice_token), excluded_checks=EXCLUDED)


def test_it_serves_the_v1beta1_openapi_document_to_token_holders(alice_api, client):
    response = alice_api.get("/v1beta1/openapi.json")
    assert response.status_code == 200
    assert "/v1beta1/projects/{project}/locations/{location}/modelDevelopmentClusters" in response.json()["paths"]
    assert client.get("/v1beta1/openapi.json").status_code == 401
