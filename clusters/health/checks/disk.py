"""Free space and inodes of the node's work, tmp and shared paths."""

import os

from .. import FAIL, PASS, Result, check, thresholds


@check("disk")
def disk(context):
    limits = thresholds(context)["disk"]
    values, problems = {}, []
    for path in context["paths"]:
        stat = os.statvfs(path)
        free = stat.f_bavail / stat.f_blocks if stat.f_blocks else 1.0
        inodes = stat.f_favail / stat.f_files if stat.f_files else 1.0
        budget = context.get("faults", {}).get("disk_full")
        if budget:
            free = 0.0  # fault injection: this node's disk budget is used up
        values[path] = {"free_fraction": round(free, 4), "free_inodes_fraction": round(inodes, 4)}
        if free < limits["min_free_fraction"]:
            problems.append(f"{path} has {free:.0%} free")
        if inodes < limits["min_free_inodes_fraction"]:
            problems.append(f"{path} has {inodes:.0%} inodes free")
    return Result(FAIL if problems else PASS, values, limits, "; ".join(problems))
