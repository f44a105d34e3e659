"""Counts test cases from a `bazel test --test_summary=short` log and the test.xml files.

Prints "N passed, N failed". A target that did not pass and whose XML shows no failing
case (a crash, a timeout, a build failure) counts as one failure.
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|FLAKY|INCOMPLETE|REMOTE FAILURE)\b")


def cases(xml_path):
    passed = failed = 0
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("status", "run") == "run" and case.find("skipped") is None:
            passed += 1
    return passed, failed


def main(log_path, testlogs):
    passed = failed = 0
    targets = 0
    with open(log_path, errors="replace") as log:
        for line in log:
            m = STATUS.match(line.strip())
            if not m:
                continue
            targets += 1
            label, status = m.group(1), m.group(2)
            pkg, _, name = label[2:].partition(":")
            counted = cases(os.path.join(testlogs, pkg, name, "test.xml")) if status != "FAILED TO BUILD" else None
            p, f = counted if counted else (0, 0)
            if status not in ("PASSED", "FLAKY") and f == 0:
                f = 1
            if status in ("PASSED", "FLAKY") and p == 0 and f == 0:
                p = 1
            passed += p
            failed += f
    if targets == 0:
        failed += 1  # Nothing ran: the build itself failed.
    print(f"{passed} passed, {failed} failed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
