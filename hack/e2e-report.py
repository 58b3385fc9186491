#!/usr/bin/env python3
"""The External Storage e2e results of hack/e2e.sh, our sidecar beside upstream's.

Usage: hack/e2e-report.py REPORT_DIR SIDE [SIDE]   (SIDE: ours, upstream)

Reads REPORT_DIR/SIDE/junit_01.xml (written by e2e.test --report-dir) and prints Markdown:
pass / skip / fail counts per suite for each side, every spec that did not pass with a side and
why (the skip reasons grouped), and the comparison. Only the specs of the focused run count:
those ginkgo left out by --focus/--skip are not "skipped" here.

Exits 1 when a spec failed with our sidecar, when a spec passed with upstream's and not with
ours, or when no spec ran; 0 otherwise.
"""

import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

# The suite's name follows the test pattern and the pattern's own tags ([Feature:Windows]...).
SPEC = re.compile(
    r"External Storage \[Driver: (?P<driver>[^\]]+)\] "
    r"\[Testpattern: (?P<pattern>[^\]]+)\] (?:\[[^\]]+\] )*(?P<suite>[^\s\[]+) (?P<rest>.*)"
)
# ginkgo's JUnit statuses that are failures of the spec.
FAILED = {"failed", "panicked", "interrupted", "timedout", "aborted"}


def outcomes(path):
    """{spec name: (status, message)} of the External Storage specs ginkgo ran in one report.

    Specs ginkgo did not run because of --focus/--skip carry the skip message "skipped" and no
    start; they are left out.
    """
    root = ET.parse(path).getroot()
    specs = {}
    for case in root.iter("testcase"):
        name = case.get("name", "")
        name = re.sub(r"^\[It\] ", "", name)
        if not SPEC.search(name):
            continue
        status = case.get("status", "")
        skipped = case.find("skipped")
        message = (skipped.get("message", "") if skipped is not None else "").strip()
        if status == "skipped" and message in ("", "skipped"):
            continue  # filtered out by the run's focus or skip
        if status in FAILED:
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            text = (failure.text or failure.get("message", "")) if failure is not None else ""
            message = first_line(text)
        specs[name] = (status, message)
    return specs


def read_events(path):
    """{(reporter, type, reason, kind): emissions} of the provisioner's and the PV controller's
    events in the specs' namespaces, from the `kubectl get events --watch-only` lines hack/e2e.sh
    records (namespace, type, reason, kind, component)."""
    counts = Counter()
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError:
        return counts
    for line in lines:
        fields = line.split("\t")
        if len(fields) != 5 or fields[0] in ("", "csi-provisioner", "default", "kube-system"):
            continue
        namespace, kind_, reason, obj, component = fields
        if component.startswith("reference.csi.example.com"):
            reporter = "the provisioner sidecar"
        elif component == "persistentvolume-controller":
            reporter = component
        else:
            continue
        counts[(reporter, kind_, reason, obj)] += 1
    return counts


def first_line(text):
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:300]
    return ""


def kind(status):
    if status == "passed":
        return "pass"
    if status == "skipped":
        return "skip"
    return "fail"


def suite_of(name):
    return SPEC.search(name).group("suite")


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    report_dir, sides = sys.argv[1], sys.argv[2:]
    results = {}
    for side in sides:
        path = f"{report_dir}/{side}/junit_01.xml"
        try:
            results[side] = outcomes(path)
        except (OSError, ET.ParseError) as e:
            print(f"{side}: no report at {path}: {e}", file=sys.stderr)
            results[side] = {}

    suites = sorted({suite_of(n) for specs in results.values() for n in specs})
    counts = {side: defaultdict(Counter) for side in sides}
    for side, specs in results.items():
        for name, (status, _) in specs.items():
            counts[side][suite_of(name)][kind(status)] += 1
            counts[side]["**total**"][kind(status)] += 1

    header = "| suite | " + " | ".join(f"{s} pass | {s} skip | {s} fail" for s in sides) + " |"
    print(header)
    print("|" + "---|" * (1 + 3 * len(sides)))
    for suite in suites + ["**total**"]:
        cells = []
        for side in sides:
            c = counts[side][suite]
            cells += [str(c["pass"]), str(c["skip"]), str(c["fail"])]
        print(f"| {suite} | " + " | ".join(cells) + " |")

    for side in sides:
        failed = sorted((n, m) for n, (s, m) in results[side].items() if kind(s) == "fail")
        print(f"\n### Failed with {side}: {len(failed)}\n")
        for name, message in failed:
            print(f"- {name}\n  - {message}")
        reasons = Counter(m for s, m in results[side].values() if s == "skipped")
        print(f"\n### Skipped with {side}, by reason\n")
        for message, n in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
            print(f"- {n} x {message}")

    events = {side: read_events(f"{report_dir}/{side}/events.tsv") for side in sides}
    keys = sorted({k for counts in events.values() for k in counts})
    print("\n### Events about the specs' claims and volumes, by who reported them\n")
    print("Every emission, repeats included: counts differ with timing (a retry is one more).")
    print("A reason reported with one sidecar and never with the other is marked **only**.\n")
    print("| reported by | type | reason | object | " + " | ".join(sides) + " |")
    print("|" + "---|" * (4 + len(sides)))
    for key in keys:
        counts = [events[side].get(key, 0) for side in sides]
        mark = " **only**" if len(sides) > 1 and 0 in counts else ""
        print("| " + " | ".join(key) + " | " + " | ".join(map(str, counts)) + mark + " |")

    verdict = 0
    ours = results.get("ours")
    if ours is not None:
        if not any(kind(s) == "pass" for s, _ in ours.values()):
            print("\nno spec passed with our sidecar", file=sys.stderr)
            verdict = 1
        if any(kind(s) == "fail" for s, _ in ours.values()):
            verdict = 1
    if "ours" in results and "upstream" in results:
        upstream = results["upstream"]
        regressions = sorted(
            n for n, (s, _) in upstream.items() if kind(s) == "pass" and kind(ours.get(n, ("", ""))[0]) != "pass"
        )
        different = sorted(
            n
            for n in set(ours) | set(upstream)
            if kind(ours.get(n, ("missing", ""))[0]) != kind(upstream.get(n, ("missing", ""))[0])
        )
        print(f"\n### Passed with upstream, not with ours: {len(regressions)}\n")
        for name in regressions:
            print(f"- {name}")
        print(f"\n### Any other difference between the two runs: {len(different) - len(regressions)}\n")
        for name in different:
            if name not in regressions:
                o = kind(ours.get(name, ("missing", ""))[0])
                u = kind(upstream.get(name, ("missing", ""))[0])
                print(f"- {name}: ours {o}, upstream {u}")
        if regressions:
            verdict = 1
    return verdict


if __name__ == "__main__":
    sys.exit(main())
