"""Counts test cases from a `bazel test --test_summary=short` log and the test.xml files.

Prints "N passed, N failed (N skipped)". A target that did not pass and whose XML shows
no failing case (a crash, a timeout, a build failure) counts as one failure. Skipped cases
(GTEST_SKIP, or a shell test's "SKIPPED..." line) are listed with their reasons on stderr
as "skipped: TARGET: REASON"; a target that failed or passed only on a later attempt
(FLAKY) gets its first failure lines there too ("failed: TARGET: LINE", "flaky: ..."), so
that the run's last lines say what broke even where only the end of its output is kept.
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|FLAKY|INCOMPLETE|REMOTE FAILURE)\b")


def cases(xml_path, skipped):
    passed = failed = 0
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    for case in root.iter("testcase"):
        skip = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif skip is not None or case.get("result") == "skipped":
            reason = (skip.get("message") if skip is not None else "") or ""
            skipped.append(f"{case.get('classname', '')}.{case.get('name')}: "
                           f"{reason.strip().splitlines()[-1] if reason.strip() else 'no reason given'}")
        elif case.get("status", "run") == "run":
            passed += 1
    return passed, failed


def target_files(testlogs, pkg, name, leaf):
    """A target's test.xml or test.log: one, or one per shard (shard_K_of_N/)."""
    base = os.path.join(testlogs, pkg, name)
    shards = sorted(d for d in (os.listdir(base) if os.path.isdir(base) else [])
                    if d.startswith("shard_"))
    return [os.path.join(base, d, leaf) for d in shards] or [os.path.join(base, leaf)]


def target_cases(testlogs, pkg, name, skipped):
    """Cases over every shard of a target; None when a shard has no readable XML."""
    passed = failed = 0
    for path in target_files(testlogs, pkg, name, "test.xml"):
        counted = cases(path, skipped)
        if counted is None:
            return None
        passed, failed = passed + counted[0], failed + counted[1]
    return passed, failed


def shell_skips(log_path, label, skipped):
    """A shell test passes with "SKIPPED: reason" lines for what it could not run."""
    try:
        with open(log_path, errors="replace") as log:
            for line in log:
                if line.startswith("SKIPPED"):
                    skipped.append(f"{label}: {line.strip()[:200]}")
    except OSError:
        pass


FAILURE = re.compile(r"^(FAIL\b|not ok\b|\[  FAILED  \]|.*: Failure$|.*\bTIMEOUT\b)")


def failure_lines(testlogs, pkg, name, limit=3):
    """The first lines that say why a target failed: its test logs, then its attempts'."""
    base = os.path.join(testlogs, pkg, name)
    logs = target_files(testlogs, pkg, name, "test.log")
    attempts = os.path.join(base, "test_attempts")
    if os.path.isdir(attempts):
        logs += [os.path.join(attempts, f) for f in sorted(os.listdir(attempts))
                 if f.endswith(".log")]
    found = []
    for path in logs:
        try:
            with open(path, errors="replace") as log:
                for line in log:
                    line = line.strip()
                    if FAILURE.match(line) and line not in found:
                        found.append(line[:240])
                        if len(found) >= limit:
                            return found
        except OSError:
            continue
    return found


def main(log_path, testlogs):
    passed = failed = 0
    targets = 0
    skipped = []
    why_not_passed = []
    with open(log_path, errors="replace") as log:
        for line in log:
            m = STATUS.match(line.strip())
            if not m:
                continue
            targets += 1
            label, status = m.group(1), m.group(2)
            pkg, _, name = label[2:].partition(":")
            counted = (target_cases(testlogs, pkg, name, skipped)
                       if status != "FAILED TO BUILD" else None)
            if status in ("PASSED", "FLAKY"):
                for log_file in target_files(testlogs, pkg, name, "test.log"):
                    shell_skips(log_file, label, skipped)
            if status not in ("PASSED", "FAILED TO BUILD"):
                kind = "flaky" if status == "FLAKY" else "failed"
                for line in failure_lines(testlogs, pkg, name) or [status]:
                    why_not_passed.append(f"{kind}: {label}: {line}")
            p, f = counted if counted else (0, 0)
            if status not in ("PASSED", "FLAKY") and f == 0:
                f = 1
            if status in ("PASSED", "FLAKY") and p == 0 and f == 0:
                p = 1
            passed += p
            failed += f
    if targets == 0:
        failed += 1  # Nothing ran: the build itself failed.
    for reason in skipped:
        print(f"skipped: {reason}", file=sys.stderr)
    for line in why_not_passed:
        print(line, file=sys.stderr)
    print(f"{passed} passed, {failed} failed ({len(skipped)} skipped)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
