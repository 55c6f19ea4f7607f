"""Simulated GPU tools for rehearsing GPU faults on nodes without GPUs (local and the fake cloud).

A node whose faults file says {"gpu": FAULT} runs `python -m clusters.health.simulated FAULT TOOL ARGS`
in place of the real TOOL (checks/gpu.py run()), which prints what the real tool prints on a node
with that fault and exits as it does. The outputs follow real ones (the layout of the captured outputs
in tests/fixtures/gpu/, cited there); only the failing values are set here. Never used on a backend
that does not take injected faults: the scan points those at no faults file at all.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
H100_LIST = "h100-list.txt"

# fault -> tool -> [(argument that selects the output, output file, exit code)]
TOOLS = {
    "dcgm": {
        # DCGM_ST_NVVS_ERROR (-30) as dcgmi's exit status: 226.
        "dcgmi": [("diag", "dcgmi-diag-fail.json", 226)],
    },
    "ecc": {
        "nvidia-smi": [("-L", H100_LIST, 0), ("ECC,ROW_REMAPPER", "nvidia-smi-q-ecc-pending.txt", 0)],
    },
    "xid": {
        "nvidia-smi": [("-L", H100_LIST, 0)],
        "journalctl": [("-k", "kernel-xid-79.log", 0)],
    },
}
KINDS = sorted(TOOLS)


def provides(fault, tool):
    return tool in TOOLS.get(fault, {})


def answer(fault, tool, args):
    """(stdout, exit code) of `tool args` on a node with `fault`."""
    for selector, name, code in TOOLS[fault][tool]:
        if selector in args:
            return (HERE / name).read_text(), code
    return "", 2
