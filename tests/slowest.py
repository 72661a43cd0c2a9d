"""The slowest cases of the last ctest run, read from its log (Testing/Temporary/LastTest.log): googletest's
"[       OK ] Name (N ms)", the CLI tests' "ok   N.N s  name" and pytest's --durations lines, with the
ctest test each belongs to. `./run test` prints them after the run (issue 64: the slowest tests measured).

Usage: python3 tests/slowest.py BUILD_DIR [COUNT]
"""
import os
import re
import sys

GTEST = re.compile(r"^\[\s+(?:OK|FAILED)\s+\] (\S+) \((\d+) ms\)$")
CLI = re.compile(r"^(?:ok  |FAIL) +([\d.]+) s  (.*)$")
PYTEST = re.compile(r"^([\d.]+)s (?:call|setup|teardown) +(\S+)$")


def cases(log):
    test = None
    for line in log:
        line = line.rstrip("\n")
        m = re.match(r"^\d+/\d+ Test: (\S+)$", line)
        if m:
            test = m.group(1)
            continue
        if (m := GTEST.match(line)):
            yield int(m.group(2)) / 1000, test, m.group(1)
        elif (m := CLI.match(line)):
            yield float(m.group(1)), test, m.group(2)
        elif (m := PYTEST.match(line)):
            yield float(m.group(1)), test, m.group(2)


def main():
    build = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    path = os.path.join(build, "Testing", "Temporary", "LastTest.log")
    if not os.path.exists(path):
        return
    with open(path, errors="replace") as f:
        found = sorted(cases(f), key=lambda c: -c[0])
    if not found:
        return
    print(f"slowest {min(count, len(found))} of {len(found)} cases (seconds, ctest test, case):")
    for seconds, test, name in found[:count]:
        print(f"{seconds:8.1f}  {test:<22} {name}")


if __name__ == "__main__":
    main()
