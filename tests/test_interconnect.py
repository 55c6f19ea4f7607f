"""The interconnect check across the four nodes of a local cluster: gloo all-reduce, then every pair.

ivy owns project "netlab" with cluster "fabric" (4 nodes). A slow link is injected on one node; the
pairwise rounds must blame that node alone, and the repair ladder must start with a reboot of it.
"""

import pytest

from clusters.choices import OperationKind, OperationStatus
from clusters.health import PASS, faults, thresholds
from clusters.health.checks.interconnect import rounds
from clusters.health.scans import evaluate_links
from clusters.models import HealthResult, Operation
from clusters.operations import engine
from clusters.spec.catalog import machine_type_info

from .conftest import api_client_for, module_cluster

pytestmark = pytest.mark.django_db
SCANS = "/api/v1/projects/netlab/clusters/fabric/scans/"
NODES = ["cpu-0", "cpu-1", "cpu-2", "cpu-3"]


@pytest.fixture(scope="module")
def cluster(django_db_setup, django_db_blocker, slurm):
    with module_cluster(django_db_blocker, username="ivy", project_slug="netlab", cluster_name="fabric", cpu=4) as c:
        yield c


@pytest.fixture
def ivy_api(cluster):
    return api_client_for(cluster.project.members.get())


def scan(api):
    response = api.post(SCANS, {"checks": ["interconnect"]}, format="json")
    assert response.status_code == 202, response.content
    operation = Operation.objects.get(uuid=response.json()["id"])
    engine.run(operation.pk)
    operation.refresh_from_db()
    assert operation.status == OperationStatus.SUCCEEDED, operation.error
    return {r.node: r for r in HealthResult.objects.filter(operation=operation)}


def test_it_measures_the_all_reduce_and_every_pair_of_a_healthy_cluster(ivy_api):
    results = scan(ivy_api)
    assert sorted(results) == NODES
    for node, result in results.items():
        assert result.status == PASS, result.reason
        assert result.values["nodes"] == 4 and result.values["busbw_gbps"] > 0
        assert sorted(result.values["pairs"]) == [n for n in NODES if n != node]
        assert result.threshold["reference_gbps"] > 0


def test_it_blames_the_node_whose_link_is_slow_to_every_peer_and_reboots_it(ivy_api, cluster, settings):
    settings.AUTO_REPAIR = True
    # 250 ms a message puts cpu-2's pairs near 0.03 GB/s, under the gloo floor (0.05): the verdict
    # does not hang on how fast the healthy pairs of a loaded machine happen to be.
    faults.inject(cluster, "cpu-2", "slow_link", 5)
    try:
        results = scan(ivy_api)
    finally:
        faults.inject(cluster, "cpu-2", "clear")
    bad = results["cpu-2"]
    assert bad.status == "fail"
    assert "slow to every peer" in bad.reason
    for node in ("cpu-0", "cpu-1", "cpu-3"):
        # A healthy node sees one slow pair at most: the one with cpu-2.
        assert results[node].status in ("pass", "warn")
        if results[node].status == "warn":
            assert "cpu-2" in results[node].reason and "every peer" not in results[node].reason
        fast = [gbps for peer, gbps in results[node].values["pairs"].items() if peer != "cpu-2"]
        assert min(fast) > results[node].values["pairs"]["cpu-2"]
    repair = Operation.objects.get(cluster=cluster, kind=OperationKind.REPAIR)
    assert repair.params == {
        "node": "cpu-2",
        "failure": "interconnect",
        "action": "reboot",
        "checks": ["interconnect"],  # the repair is verified by the check that failed
    }
    engine.run(repair.pk)
    repair.refresh_from_db()
    assert repair.status == OperationStatus.SUCCEEDED, repair.error
    # The fault is gone, so the reboot is verified: every node's links pass again.
    timeline = list(cluster.events.order_by("id").values_list("message", flat=True))
    assert "Repaired cpu-2 (interconnect) by reboot: interconnect passes on all 4 scanned nodes" in timeline, "\n".join(
        timeline
    )
    assert not Operation.objects.filter(cluster=cluster, kind=OperationKind.REPAIR, status="PENDING").exists()


@pytest.mark.parametrize("world", [2, 3, 4, 7, 8, 16, 17, 64])
def test_it_pairs_nodes_in_disjoint_rounds(world):
    found = rounds(world, pairwise_max_nodes=16)
    for pairs in found:
        ranks = [r for pair in pairs for r in pair]
        assert len(ranks) == len(set(ranks)), "a node is in two pairs of one round"
    pairs = {pair for r in found for pair in r}
    if world <= 16:
        assert len(found) == world - (world % 2 == 0)
        assert pairs == {(a, b) for a in range(world) for b in range(a + 1, world)}
    else:
        assert len(found) <= 3  # ring neighbours only: a large scan stays a few rounds long
        assert pairs == {tuple(sorted((i, (i + 1) % world))) for i in range(world)}


def report(pairs):
    return {"interconnect": {"status": PASS, "values": {"backend": "gloo", "busbw_gbps": 1.0, "pairs": pairs}}}


def test_it_can_only_warn_when_the_one_pair_of_two_nodes_is_below_the_floor():
    reports = {"a": report({"b": 0.01}), "b": report({"a": 0.01})}
    evaluate_links(reports, thresholds()["interconnect"])
    assert [reports[n]["interconnect"]["status"] for n in "ab"] == ["warn", "warn"]
    assert "slow link to" in reports["a"]["interconnect"]["reason"]


def test_it_names_a_bad_path_between_two_healthy_nodes_without_failing_either():
    fast = 2.0
    links = {("a", "b"): 0.1, ("a", "c"): fast, ("b", "c"): fast, ("a", "d"): fast, ("b", "d"): fast, ("c", "d"): fast}
    reports = {n: report({(set(k) - {n}).pop(): v for k, v in links.items() if n in k}) for n in ("a", "b", "c", "d")}
    evaluate_links(reports, thresholds()["interconnect"])
    statuses = {n: reports[n]["interconnect"]["status"] for n in reports}
    assert statuses == {"a": "warn", "b": "warn", "c": "pass", "d": "pass"}
    assert reports["a"]["interconnect"]["reason"].startswith("slow link to b 0.1 GB/s")


def test_it_fails_the_slow_node_and_keeps_the_slow_all_reduce_in_every_reason():
    slow, fast = 0.03, 1.0
    links = {("a", "b"): fast, ("a", "c"): fast, ("b", "c"): fast, ("a", "d"): slow, ("b", "d"): slow, ("c", "d"): slow}
    reports = {n: report({(set(k) - {n}).pop(): v for k, v in links.items() if n in k}) for n in ("a", "b", "c", "d")}
    for r in reports.values():
        r["interconnect"]["values"]["busbw_gbps"] = 0.02  # one slow link slows everyone's all-reduce
    evaluate_links(reports, thresholds()["interconnect"])
    d = reports["d"]["interconnect"]
    assert d["status"] == "fail"
    assert d["reason"].startswith("slow to every peer") and "all-reduce bus bandwidth 0.02" in d["reason"]
    a = reports["a"]["interconnect"]
    assert a["status"] == "warn"
    assert a["reason"].startswith("slow link to d 0.03 GB/s") and "all-reduce" in a["reason"]


def nccl_report(pairs, busbw=40.0):
    return {"interconnect": {"status": PASS, "values": {"backend": "nccl", "busbw_gbps": busbw, "pairs": pairs}}}


def test_on_a_machine_type_with_a_known_gpu_nic_a_pair_far_under_its_line_rate_is_slow_even_if_all_are():
    # Three A3 Ultra nodes whose NCCL fell back to sockets over the system NIC: every pair equally slow, so
    # the pairs' median says nothing; a quarter of the 400 Gbps GPU NIC (12.5 GB/s) does.
    nic = machine_type_info("a3-ultragpu-8g").gpu_nic_gbps
    assert nic == 400
    slow = {n: nccl_report({p: 3.1 for p in "abc" if p != n}) for n in "abc"}
    evaluate_links(slow, thresholds()["interconnect"], nic)
    # Not one node's link: every node warns (no node is rebooted for the fabric's or NCCL's fault).
    assert {n: slow[n]["interconnect"]["status"] for n in "abc"} == dict.fromkeys("abc", "warn")
    assert "under 12.5 GB/s: 25% of a 400 Gbps GPU NIC" in slow["a"]["interconnect"]["reason"]
    assert "NCCL's network or the fabric, not one node" in slow["a"]["interconnect"]["reason"]
    assert slow["a"]["interconnect"]["threshold"]["min_gbps"] == 12.5
    # One node whose NIC runs far under its line rate, among healthy ones, fails: its own link.
    one = {("a", "b"): 44.0, ("a", "c"): 3.1, ("b", "c"): 3.3}
    mixed = {n: nccl_report({(set(k) - {n}).pop(): v for k, v in one.items() if n in k}) for n in "abc"}
    evaluate_links(mixed, thresholds()["interconnect"], nic)
    assert {n: mixed[n]["interconnect"]["status"] for n in "abc"} == {"a": "warn", "b": "warn", "c": "fail"}
    healthy = {n: nccl_report({p: 44.0 for p in "abc" if p != n}) for n in "abc"}
    evaluate_links(healthy, thresholds()["interconnect"], nic)
    assert {n: healthy[n]["interconnect"]["status"] for n in "abc"} == dict.fromkeys("abc", "pass")
    # Without a recorded line rate (A3 Mega: Google's pages disagree) only the generic NCCL floor applies.
    assert machine_type_info("a3-megagpu-8g").gpu_nic_gbps == 0
    unknown = {n: nccl_report({p: 3.1 for p in "abc" if p != n}) for n in "abc"}
    evaluate_links(unknown, thresholds()["interconnect"], 0)
    assert {n: unknown[n]["interconnect"]["status"] for n in "abc"} == dict.fromkeys("abc", "pass")
