"""The GPU checks read real tool outputs (tests/fixtures/gpu/, each cited in its README) and the
simulated tools' failing ones: ECC and row remapping per GPU, DCGM's report whatever dcgmi's exit
code, Xids from the kernel log, the GPU inventory. No Slurm here: the checks run as the agent runs
them, with a context.
"""

import json
import re
import shutil
from pathlib import Path

import pytest

from clusters.health import FAIL, PASS, SKIPPED, WARN, thresholds
from clusters.health.checks import correctness, dcgm, ecc, gpu, gpu_inventory, nvlink, on_gpu, speed, xid
from clusters.health.simulated import HERE as SIMULATED

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu"
LIMITS = thresholds()["ecc"]


def fixture(name):
    return (FIXTURES / name).read_text()


def test_it_passes_a_healthy_a100_report_and_reads_both_gpus():
    result = ecc.read(fixture("nvidia-smi-q-ecc-a100-pcie.txt"), LIMITS)
    assert result.status == PASS, result.reason
    assert set(result.values) == {"00000000:12:00.0", "00000000:8A:00.0"}
    assert result.values["00000000:12:00.0"]["volatile_uncorrectable"] == 0


@pytest.mark.parametrize("field", ["SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED", "DRAM Uncorrectable"])
def test_it_counts_every_uncorrectable_counter_of_a_real_report(field):
    # Recent drivers print no plain "Uncorrectable" counter: SRAM's is split in two.
    text = fixture("nvidia-smi-q-ecc-a100-pcie.txt")
    injected = re.sub(rf"({re.escape(field)}\s+: )0", r"\g<1>3", text, count=1)  # GPU 0's Volatile section
    assert injected != text
    result = ecc.read(injected, LIMITS)
    assert result.status == FAIL
    assert result.values["00000000:12:00.0"]["volatile_uncorrectable"] == 3
    assert result.values["00000000:8A:00.0"]["volatile_uncorrectable"] == 0
    assert result.reason == "GPU 00000000:12:00.0: 3 uncorrectable ECC errors since the last reset"


def test_a_pending_row_remap_after_an_xid_63_fails_the_gpu():
    result = ecc.read(fixture("nvidia-smi-q-a100-sxm4-remap-pending.txt"), LIMITS)
    assert result.status == FAIL
    assert result.values["00000000:10:1C.0"]["remap_pending"] is True
    assert result.values["00000000:10:1C.0"]["volatile_correctable"] == 177
    assert "a row remap is pending" in result.reason
    assert result.repair == ""  # a reset applies the remap: the ladder reboots first


def test_lifetime_errors_alone_warn_and_a_failed_remap_fails():
    text = fixture("nvidia-smi-q-a100-sxm4-remap-pending.txt").replace(
        "Pending                           : Yes", "Pending                           : No"
    )
    history = re.sub(r"(Aggregate\n(?:.*\n){3}\s+DRAM Uncorrectable\s+: )0", r"\g<1>2", text)
    assert history != text
    result = ecc.read(history, {**LIMITS, "max_correctable_volatile": 1000})
    assert (result.status, result.reason) == (
        WARN,
        "GPU 00000000:10:1C.0: 2 uncorrectable ECC errors in the GPU's lifetime",
    )
    failed = text.replace("Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes")
    assert "RMA" in ecc.read(failed, LIMITS).reason
    assert ecc.read(failed, LIMITS).repair == "replace"  # no reset fixes it


def test_the_simulated_ecc_fault_fails_gpu_3_only():
    result = ecc.ecc({"faults": {"gpu": "ecc"}})
    assert result.status == FAIL
    failing = [
        bus for bus, values in result.values.items() if values["volatile_uncorrectable"] or values["remap_pending"]
    ]
    assert failing == ["00000000:0B:00.0"]
    assert len(result.values) == 8


def test_a_tool_that_exits_non_zero_is_read_and_only_a_missing_one_skips():
    assert gpu.run(["no-such-gpu-tool"], {}) is None
    output = gpu.run(["dcgmi", "diag", "-r", "2", "-j"], {"faults": {"gpu": "dcgm"}})
    assert output.code == 226  # DCGM_ST_NVVS_ERROR, as dcgmi exits when a test fails
    assert json.loads(output.stdout)["DCGM Diagnostic"]


def test_a_failing_dcgmi_fails_the_node_naming_the_test_gpu_and_dcgms_message():
    result = dcgm.dcgm({"faults": {"gpu": "dcgm"}})
    assert result.status == FAIL
    assert result.reason == "memory on GPU 3 (GPU 3 had memory errors and row remappings are pending)"
    assert result.values["tests"]["memory"]["GPU 3"] == "fail"
    assert result.values["tests"]["software"]["GPU 0"] == "pass"


def test_it_reads_dcgm_3_reports_and_refuses_a_run_that_said_nothing():
    dcgm3 = "Successfully ran diagnostic for group.\n" + json.dumps(
        {
            "DCGM GPU Diagnostic": {
                "test_categories": [
                    {
                        "category": "Hardware",
                        "tests": [{"name": "GPU Memory", "results": [{"gpu_id": "0", "status": "Pass"}]}],
                    }
                ],
                "version": "3.3.9",
            }
        }
    )
    passed, _ = dcgm.read(dcgm3, 2)
    assert (passed.status, passed.values["tests"]) == (PASS, {"GPU Memory": {"GPU 0": "pass"}})
    failed, _ = dcgm.read(dcgm3.replace('"Pass"', '"Fail"'), 2)
    assert (failed.status, failed.reason) == (FAIL, "GPU Memory on GPU 0")
    nothing, problem = dcgm.read("Error: unable to establish a connection to the specified host: localhost\n", 2)
    assert nothing is None and problem == "no JSON in dcgmi's output"
    runtime = json.dumps({"DCGM Diagnostic": {"runtime_error": "Unable to find the NVVS binary"}})
    assert dcgm.read(runtime, 2)[0].reason == "dcgmi could not run: Unable to find the NVVS binary"


def test_hardware_xids_fail_program_xids_are_ignored_and_the_rest_warn():
    status, values, reason = xid.read(fixture("kernel-xid.log"))
    assert status == FAIL
    assert values == {"0000:10:1c": {"63": 1}, "0000:2b:00": {"79": 1}}
    assert reason == (
        "Xid 79 x1 on 0000:2b:00: GPU has fallen off the bus; "
        "Xid 63 x1 on 0000:10:1c: ECC page retirement or row remapping recording event (a reset applies it)"
    )
    program = (
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, Graphics Exception\nNVRM: Xid (PCI:0000:3b:00): 31, pid=1, MMU Fault\n"
    )
    assert xid.read(program)[0] == PASS
    assert xid.read("NVRM: Xid (PCI:0000:3b:00): 999, something new")[0] == WARN
    # Blackwell's (NVIDIA's memory error management guide): the SRAM side of an uncorrectable error fails,
    # memory marked for repair waits for a reset.
    blackwell = xid.read("NVRM: Xid (PCI:0000:8f:00): 172, pid=1\nNVRM: Xid (PCI:0000:90:00): 160, pid=2\n")
    assert blackwell[0] == FAIL and blackwell[2] == (
        "Xid 172 x1 on 0000:8f:00: uncorrectable SRAM ECC error (with Xid 48); "
        "Xid 160 x1 on 0000:90:00: GPU memory marked for repair (a reset applies it)"
    )
    assert xid.xid({"faults": {"gpu": "xid"}}).status == FAIL


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has GPU tools")
def test_gpu_checks_skip_on_a_node_without_gpu_tools():
    for check in (ecc.ecc, dcgm.dcgm, xid.xid, gpu_inventory.gpu_inventory):
        assert check({"gpus_per_node": 0}).status == SKIPPED


def test_the_inventory_reads_real_listings():
    listing = fixture("nvidia-smi-list-h100-pcie.txt").splitlines()
    assert [line.split(":")[1].split("(")[0].strip() for line in listing] == ["NVIDIA H100 PCIe"] * 2
    simulated = {"faults": {"gpu": "xid"}, "gpus_per_node": 8, "accelerator_type": "NVIDIA_H100_MEGA_80GB"}
    assert gpu_inventory.gpu_inventory(simulated).status == PASS
    assert gpu_inventory.gpu_inventory({**simulated, "gpus_per_node": 4}).status == FAIL


def test_the_inventory_knows_each_machine_types_gpu_by_its_real_name():
    b200 = gpu.Output(0, fixture("nvidia-smi-list-b200.txt"), "")
    h100 = gpu.Output(0, fixture("nvidia-smi-list-h100-pcie.txt"), "")
    assert gpu_inventory.judge(b200, 2, "NVIDIA_B200").status == PASS  # A4
    refused = gpu_inventory.judge(b200, 2, "NVIDIA_H200_141GB")  # an A3 Ultra partition with B200s in it
    assert refused.status == FAIL and refused.reason == "found 2 GPUs, expected 2 x H200"
    assert gpu_inventory.judge(h100, 2, "NVIDIA_H100_80GB").status == PASS  # A3 High and Edge
    assert gpu_inventory.judge(b200, 2, "NVIDIA_H100_80GB").status == FAIL  # once any model passed there
    assert gpu_inventory.judge(b200, 8, "NVIDIA_B200").reason == "found 2 GPUs, expected 8 x B200"
    gb200 = gpu.Output(0, fixture("nvidia-smi-list-gb200.txt"), "")
    assert gpu_inventory.judge(gb200, 1, "NVIDIA_GB200").status == PASS  # A4X
    assert gpu_inventory.judge(b200, 2, "NVIDIA_GB200").status == FAIL  # an A4X partition with A4's GPUs


def test_every_simulated_output_exists():
    from clusters.health.simulated import TOOLS

    for tools in TOOLS.values():
        for answers in tools.values():
            for _, name, _ in answers:
                assert (SIMULATED / name).is_file(), name


# The GPU paths of correctness and speed take device names: here three "GPUs" that are the CPU.
DEVICES = ["cpu:0", "cpu:1", "cpu:2"]
H100 = {"name": "H100 80GB", "bf16_tflops": 989, "host_to_device_gbps": 64}


def test_every_gpu_computes_the_same_chains_and_a_corrupt_one_is_named():
    limits = {**thresholds()["correctness"], "gpu_size": 256}
    healthy = correctness.on_gpus(DEVICES, limits)
    assert healthy.status == PASS
    assert set(healthy.values["gpus"].values()) == {healthy.values["checksum"]}
    corrupt = correctness.on_gpus(DEVICES, limits, perturb=True)
    assert (corrupt.status, corrupt.reason) == (FAIL, "cpu:2 differs from the other 2 GPUs")
    assert corrupt.values["checksum"] == healthy.values["checksum"]  # the node still reports the majority's
    split = correctness.on_gpus(DEVICES[:2], limits, perturb=True)
    assert (split.status, split.values["checksum"]) == (FAIL, "")


def test_a_gpu_under_half_its_peak_or_its_host_link_fails_and_names_the_gpu():
    limits = {**thresholds()["speed"], "gpu_size": 128, "gpu_seconds": 0.15}
    # The CPU reaches a tiny fraction of an H100's 989 TFLOPS: every "GPU" is under the floor.
    result = speed.on_gpus(DEVICES[:2], limits, H100)
    assert result.status == FAIL
    assert "cpu:0 reaches 0 bf16 TFLOPS, under 50% of the H100 80GB's 989" in result.reason
    assert result.values["gflops"] == pytest.approx(min(result.values["tflops"].values()) * 1000, abs=5)  # 0.01 TFLOPS
    assert set(result.values["host_to_device_gbps"]) == set(DEVICES[:2])
    # Without the accelerator's figures only the node's own GPUs are compared: a throttled one fails.
    throttled = speed.on_gpus(DEVICES, {**limits, "gpu_seconds": 0.3}, None, slow=5)
    assert throttled.status == FAIL
    assert re.search(r"cpu:2 reaches \d+ TFLOPS, \d+% of the node's median GPU", throttled.reason)


def test_the_node_all_reduce_measures_every_local_rank_and_a_slow_fabric_fails():
    # Two ranks over gloo on the CPU stand in for the node's GPUs over NCCL: the same processes,
    # rendezvous and measurement.
    busbw = on_gpu.local_all_reduce_busbw(2, backend="gloo", megabytes=4, iterations=3)
    assert busbw > 0
    limits = thresholds()["nvlink"]
    healthy = nvlink.judge(400.0, 8, limits, H100 | {"nvlink_gbps": 450})
    assert (healthy.status, healthy.threshold["min_busbw_gbps"]) == (PASS, 112.5)
    over_pcie = nvlink.judge(48.0, 8, limits, H100 | {"nvlink_gbps": 450})
    assert over_pcie.status == FAIL
    assert over_pcie.reason == "all-reduce over 8 GPUs at 48 GB/s, under 112 (GPUs over PCIe, or a link down?)"
    assert nvlink.nvlink({"gpus_per_node": 8}).status == SKIPPED  # torch sees no GPU here
