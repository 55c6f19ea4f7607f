"""Safe defaults: DEBUG off, a generated SECRET_KEY, check --deploy clean with the production
settings, a sign-in throttle, and no secret in any page, API answer or log line."""

import os
import stat
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from console.models import SignInFailure

from .factories import exchange, leaks

pytestmark = pytest.mark.django_db


def run_manage(*args, **env):
    # The test run's own switches (the browser tests allow async-unsafe calls) are not the deployment's.
    dropped = ("DEBUG", "SECRET_KEY", "DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE")
    clean = {k: v for k, v in os.environ.items() if k not in dropped}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR,
        env={**clean, "DJANGO_SETTINGS_MODULE": "console.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_starts_with_debug_off_and_a_generated_key_kept_private(tmp_path):
    shown = run_manage(
        "shell", "-v0", "-c",
        "from django.conf import settings; print(settings.DEBUG, settings.SECRET_KEY, *settings.ALLOWED_HOSTS)",
        CONSOLE_VAR_DIR=str(tmp_path),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    debug, key, *hosts = shown.stdout.split()
    assert debug == "False"
    assert hosts == ["localhost", "127.0.0.1", "[::1]"]  # Django's test client host is the tests' alone
    keyfile = tmp_path / "secret_key"
    assert keyfile.read_text().strip() == key and len(key) >= 50
    assert stat.S_IMODE(keyfile.stat().st_mode) == 0o600
    again = run_manage(
        "shell", "-v0", "-c", "from django.conf import settings; print(settings.SECRET_KEY)",
        CONSOLE_VAR_DIR=str(tmp_path),
    )  # fmt: skip
    assert again.stdout.strip() == key  # every process of the machine signs with the same key


def test_check_deploy_is_clean_with_the_documented_production_settings(tmp_path):
    result = run_manage(
        "check", "--deploy", "--fail-level", "WARNING",
        DEBUG="false", HTTPS="true", ALLOWED_HOSTS="console.example.com", CONSOLE_VAR_DIR=str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_it_refuses_a_drain_shorter_than_the_requests_it_would_cut(tmp_path):
    """A drain stops a replica at the latest ENDPOINT_DRAIN_SECONDS after it began; a request may run
    ROUTER_REQUEST_TIMEOUT. The old default (30 s against 120 s) cut long requests mid-answer."""
    shown = run_manage("shell", "-v0", "-c", "from django.conf import settings; print(settings.ENDPOINT_DRAIN_SECONDS)",
                       CONSOLE_VAR_DIR=str(tmp_path))  # fmt: skip
    assert shown.returncode == 0 and float(shown.stdout) == 125.0, shown.stderr  # 120 + 2 refreshes + a connect
    refused = run_manage("check", ENDPOINT_DRAIN_SECONDS="30", CONSOLE_VAR_DIR=str(tmp_path))
    assert refused.returncode != 0
    assert "ENDPOINT_DRAIN_SECONDS (30) must be at least ROUTER_REQUEST_TIMEOUT (120)" in refused.stderr


def test_it_throttles_sign_ins_after_five_failures_for_a_username(client, alice, bob):
    for _ in range(5):
        assert client.post("/accounts/login/", {"username": "alice", "password": "wrong"}).status_code == 200
    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-password"})
    assert response.status_code == 429
    assert b"Too many failed sign-ins; try again in 15 minutes." in response.content
    assert "_auth_user_id" not in client.session
    assert client.post("/accounts/login/", {"username": "bob", "password": "bob-password"}).status_code == 302
    client.logout()
    SignInFailure.objects.update(created=timezone.now() - timedelta(minutes=16))
    assert client.post("/accounts/login/", {"username": "alice", "password": "alice-password"}).status_code == 302
    assert not SignInFailure.objects.filter(username="alice").exists()


def test_charlie_cannot_lock_alice_out_by_failing_with_her_name_from_elsewhere(client, alice):
    for _ in range(5):
        client.post("/accounts/login/", {"username": "alice", "password": "guess"}, REMOTE_ADDR="203.0.113.66")
    refused = client.post("/accounts/login/", {"username": "alice", "password": "guess"}, REMOTE_ADDR="203.0.113.66")
    assert refused.status_code == 429  # charlie's address is throttled for that name
    signed_in = client.post(
        "/accounts/login/", {"username": "alice", "password": "alice-password"}, REMOTE_ADDR="198.51.100.7"
    )
    assert signed_in.status_code == 302 and client.session["_auth_user_id"] == str(alice.pk)
    assert SignInFailure.objects.filter(address="203.0.113.66").count() == 5  # her sign-in clears only her own


def test_it_throttles_one_address_trying_many_usernames(client, alice, settings):
    settings.LOGIN_FAILURES_PER_ADDRESS = 3
    for name in ("a", "b", "c"):
        client.post("/accounts/login/", {"username": name, "password": "x"})
    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-password"})
    assert response.status_code == 429


def test_no_secret_reaches_a_page_an_api_answer_an_error_or_a_log_line(
    client, alice, alpha, scripted, caplog, settings
):
    from rest_framework.test import APIClient

    from clusters.operations import engine

    from .conftest import scripted_spec

    caplog.set_level("DEBUG")
    settings.CELERY_BROKER_URL = "redis://:broker-password-0451@127.0.0.1:6379/15"
    client.force_login(alice)
    response = client.post("/tokens/", {"name": "laptop", "expires_days": "30"})
    raw = response.context["new_secret"]  # shown once, on purpose, on the page that made it
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    secrets = {"api token": raw, "SECRET_KEY": settings.SECRET_KEY, "broker password": "broker-password-0451"}
    texts = []
    create = api.post(
        "/api/v1/projects/alpha/clusters/", {"cluster_id": "demo", "spec": scripted_spec()}, format="json"
    )
    texts.append(create.content.decode())
    from clusters.models import Operation

    engine.run(Operation.objects.get().pk)
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION=f"Bearer {raw[:-4]}abcd")
    for who, method, path, kwargs in [
        (client, "get", "/", {}),
        (client, "get", "/tokens/", {}),
        (client, "get", "/clusters/alpha/demo/", {}),
        (client, "get", "/clusters/alpha/demo/events/", {}),
        (client, "get", "/clusters/alpha/nowhere/", {}),
        (client, "get", "/api/schema/", {}),
        (api, "get", "/api/v1/projects/alpha/clusters/demo/", {}),
        (api, "get", "/api/v1/projects/alpha/clusters/demo/events/", {}),
        (api, "post", "/api/v1/projects/alpha/clusters/", {"data": {"cluster_id": "x\n"}, "format": "json"}),
        (api, "get", "/v1beta1/projects/alpha/locations/us-central1/modelDevelopmentClusters", {}),
        (api, "get", "/v1beta1/projects/alpha/locations/us-central1/operations/nope", {}),
        (bad, "get", "/api/v1/projects/", {}),
        (bad, "get", "/v1beta1/projects/alpha/locations/us-central1/modelDevelopmentClusters", {}),
    ]:
        response, text = exchange(who, method, path, **kwargs)
        assert response.status_code < 500, (path, response.status_code)
        texts.append(text)
    texts.append(caplog.text)
    assert leaks(texts, secrets) == set()
    assert leaks([f"x {raw} y"], secrets) == {"api token"}  # the check itself can fail
