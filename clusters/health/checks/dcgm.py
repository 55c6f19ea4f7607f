"""`dcgmi diag -r LEVEL`, parsed per test, when DCGM is installed."""

import json

from .. import FAIL, PASS, SKIPPED, Result, check, thresholds
from .gpu import run


@check("dcgm")
def dcgm(context):
    level = thresholds(context)["dcgm"]["level"]
    output = run(["dcgmi", "diag", "-r", str(level), "-j"], timeout=1800)
    if output is None:
        return Result(SKIPPED, reason="no GPU or DCGM (dcgmi not found)")
    tests = {}
    for category in json.loads(output).get("DCGM GPU Diagnostic", {}).get("test_categories", []):
        for test in category.get("tests", []):
            tests[test["name"]] = sorted({r.get("status", "") for r in test.get("results", [])})
    failed = [name for name, statuses in tests.items() if "Fail" in statuses]
    return Result(FAIL if failed else PASS, {"tests": tests}, {"level": level}, ", ".join(failed))
