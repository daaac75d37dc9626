"""Runs the client conformance suite (docs/architecture.md, "One client behaviour"): the same
scenarios and the same optimizer texts against the C++ SDK and the Python client, each compared
with the expectation written in the data and with the other client.

  run_conformance.py session --cpp-driver BIN SCENARIO.json...
      For each client, a fresh FakeCoordinator (fake_coordinator.py) plays the scenario while the
      client's driver (session_driver, session_driver.py) runs its actions; the driver's lines (what
      the client observed) must match the scenario's expect.client and the fake's record (what the
      client asked) its expect.calls.
  run_conformance.py optimizer --cpp-driver BIN TABLE.json
      Every row as `pipetrain train` reads it (optimizer_driver cli) and as the Python client
      builds it, read by the coordinator (optimizer_driver.py, then optimizer_driver spec), must
      give the row's "expect".

Expected and actual lines are compared after consecutive equal lines are folded into "LINE ×N":
an expected "LINE ×+" matches one or more (counts that depend on time, e.g. polls until a
timeout), and an expected "RESULT | words" requires the words in the message after the code
(messages differ between the clients in their wording; everything before " | " must be equal).
Exit code 0 when everything matched, 1 otherwise (with the differences on stdout). Needs the
built Python package on PYTHONPATH (build/python).
"""

import argparse
import difflib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Each driver run is bounded: the scenarios' own timeouts are a few seconds at most.
DRIVER_TIMEOUT_S = 120
FOLD = " \u00d7"  # " ×"


def fold(lines):
    """Consecutive equal lines as "LINE ×N"."""
    out = []
    for line in lines:
        if out and out[-1][0] == line:
            out[-1][1] += 1
        else:
            out.append([line, 1])
    return [line if n == 1 else "%s%s%d" % (line, FOLD, n) for line, n in out]


def split_count(line):
    """("LINE", count) of a folded line: count an int, or "+" for "LINE ×+"."""
    body, sep, count = line.rpartition(FOLD)
    if sep and (count == "+" or count.isdigit()):
        return body, (count if count == "+" else int(count))
    return line, 1


def split_message(body):
    head, sep, message = body.partition(" | ")
    return head, (message if sep else None)


def match(expected, actual):
    """Whether the folded `actual` lines match `expected`; returns (ok, the lines normalised for a
    comparison with the other client: counts written "+" where the expectation allows any, and
    messages left out)."""
    normalised = []
    ok = len(expected) == len(actual)
    for i, line in enumerate(actual):
        body, count = split_count(line)
        head, message = split_message(body)
        shown = head if count == 1 else "%s%s%s" % (head, FOLD, count)
        if i < len(expected):
            want_body, want_count = split_count(expected[i])
            want_head, want_words = split_message(want_body)
            line_ok = (want_head == head and (want_count == "+" or want_count == count)
                       and (want_words is None or (message is not None and want_words in message)))
            if line_ok and want_count == "+":
                shown = "%s%s+" % (head, FOLD)
            ok = ok and line_ok
        normalised.append(shown)
    return ok, normalised


def report(title, expected, actual):
    print("--- %s: expected / actual" % title)
    for line in difflib.unified_diff(expected, actual, "expected", "actual", lineterm="", n=50):
        print(line)


def run_driver(command, env=None):
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=DRIVER_TIMEOUT_S, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError("%s exited with %d:\n%s" % (command, done.returncode, done.stderr))
    return done.stdout.splitlines()


def play(scenario_path, scenario, command):
    """Runs `command` + [scenario, address] against a fresh fake; returns (client lines, calls)."""
    from fake_coordinator import FakeCoordinator  # needs pipetrain.v1 on the path
    fake = FakeCoordinator(scenario)
    address = fake.start()
    try:
        lines = run_driver(command + [scenario_path, address])
    finally:
        fake.stop()
    return lines, fake.record()


def session(args):
    drivers = {"C++": [args.cpp_driver],
               "Python": [sys.executable, os.path.join(HERE, "session_driver.py")]}
    failed = 0
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            scenario = json.load(f)
        name = os.path.splitext(os.path.basename(path))[0]
        expect = scenario["expect"]
        seen = {}
        ok = True
        for client, command in drivers.items():
            lines, calls = play(path, scenario, command)
            client_ok, client_norm = match(fold(expect["client"]), fold(lines))
            calls_ok, calls_norm = match(fold(expect["calls"]), fold(calls))
            if not client_ok:
                report("%s, %s client" % (name, client), fold(expect["client"]), fold(lines))
            if not calls_ok:
                report("%s, %s calls" % (name, client), fold(expect["calls"]), fold(calls))
            ok = ok and client_ok and calls_ok
            seen[client] = client_norm + ["--"] + calls_norm
        if seen["C++"] != seen["Python"]:
            report("%s: the C++ client / the Python client" % name, seen["C++"], seen["Python"])
            ok = False
        print("%s %s" % ("ok  " if ok else "FAIL", name))
        failed += not ok
    return 1 if failed else 0


def optimizer(args):
    with open(args.table, encoding="utf-8") as f:
        table = json.load(f)
    rows = table["rows"]
    cli = run_driver([args.cpp_driver, "cli", args.table])
    python_specs = run_driver([sys.executable, os.path.join(HERE, "optimizer_driver.py"),
                               args.table])
    spec = subprocess.run([args.cpp_driver, "spec", args.table], input="\n".join(python_specs),
                          stdout=subprocess.PIPE, text=True, timeout=DRIVER_TIMEOUT_S,
                          check=True).stdout.splitlines()
    failed = 0
    for i, row in enumerate(rows):
        label = row["optimizer"] + ("" if "lr_schedule" not in row
                                    else " + lr_schedule " + json.dumps(row["lr_schedule"]))
        for client, lines in (("C++", cli), ("Python", spec)):
            got = lines[i] if i < len(lines) else "(no answer)"
            if not match([row["expect"]], [got])[0]:
                print("FAIL %s, %s client:\n  expected %s\n  actual   %s"
                      % (label, client, row["expect"], got))
                failed += 1
        if split_message(cli[i])[0] != split_message(spec[i])[0]:
            print("FAIL %s: the C++ client %s, the Python client %s" % (label, cli[i], spec[i]))
            failed += 1
    print("%d rows, %d differences" % (len(rows), failed))
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("session")
    s.add_argument("--cpp-driver", required=True)
    s.add_argument("files", nargs="+")
    o = sub.add_parser("optimizer")
    o.add_argument("--cpp-driver", required=True)
    o.add_argument("table")
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    return session(args) if args.command == "session" else optimizer(args)


if __name__ == "__main__":
    sys.exit(main())
