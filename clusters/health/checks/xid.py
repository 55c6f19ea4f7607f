"""Xid errors the NVIDIA driver logged to the kernel since boot (`journalctl -k -b`, else `dmesg`).

A line reads "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: ..."; each code is judged by
clusters/health/xids.json (NVIDIA's Xid catalog): a hardware Xid fails the node, an Xid a user's
program causes is ignored, the rest warn. Skipped on a node without an NVIDIA GPU.
"""

import json
import re
from collections import Counter
from functools import cache
from pathlib import Path

from .. import FAIL, PASS, SKIPPED, WARN, Result, check
from .gpu import run

LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)")


@cache
def catalog():
    data = json.loads((Path(__file__).resolve().parent.parent / "xids.json").read_text())
    return {
        int(code): (verdict, name) for verdict in ("fail", "warn", "ignore") for code, name in data[verdict].items()
    }


def read(log):
    """(status, {"PCI id": {xid: count}}, reason) for a kernel log."""
    seen = {}
    for match in LINE.finditer(log):
        seen.setdefault(match[1], Counter())[int(match[2])] += 1
    findings = {FAIL: [], WARN: []}
    for device, codes in sorted(seen.items()):
        for code, count in sorted(codes.items()):
            verdict, name = catalog().get(code, ("warn", "not in the console's Xid table"))
            if verdict != "ignore":
                findings[FAIL if verdict == "fail" else WARN].append(f"Xid {code} x{count} on {device}: {name}")
    status = FAIL if findings[FAIL] else WARN if findings[WARN] else PASS
    values = {device: {str(code): count for code, count in codes.items()} for device, codes in seen.items()}
    return status, values, "; ".join(findings[FAIL] + findings[WARN])


@check("xid")
def xid(context):
    if run(["nvidia-smi", "-L"], context) is None:
        return Result(SKIPPED, reason="no GPU (nvidia-smi not found)")
    output = run(["journalctl", "-k", "-b", "--no-pager", "-q"], context)
    if output is None or output.code != 0:
        output = run(["dmesg"], context) or output
    if output is None or output.code != 0:
        return Result(WARN, {}, {}, "the kernel log could not be read" + (f" ({output.problem()})" if output else ""))
    status, values, reason = read(output.stdout)
    return Result(status, values, {"table": "clusters/health/xids.json"}, reason)
