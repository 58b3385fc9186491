#!/usr/bin/env python3
"""The External Storage e2e results of hack/e2e.sh, our sidecar beside upstream's.

Usage: hack/e2e-report.py REPORT_DIR SIDE [SIDE] [--baseline FILE]   (SIDE: ours, upstream)
       hack/e2e-report.py --write-baseline FILE REPORT_DIR

Reads REPORT_DIR/SIDE/junit_01.xml (written by e2e.test --report-dir) and prints Markdown:
pass / skip / fail counts per suite for each side, every spec that did not pass with a side and
why (the skip reasons grouped), and the comparison. Only the specs of the focused run count:
those ginkgo left out by --focus/--skip are not "skipped" here.

Upstream's side does not change when our code does: --write-baseline keeps what a run of it
found (each spec's outcome, the events, Ginkgo's account) in FILE, and --baseline FILE reads the
side "upstream" from there instead of REPORT_DIR/upstream.

Exits 1 when a spec failed with our sidecar, when a spec passed with upstream's and not with
ours, or when no spec ran; 0 otherwise.
"""

import json
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
    """({(reporter, type, reason, kind): emissions}, {(reporter, reason, generic text): emissions}
    of warnings) of the provisioner's and the PV controller's events in the specs' namespaces,
    from the `kubectl get events --watch-only` lines hack/e2e.sh records (namespace, type,
    reason, kind, component, message)."""
    counts, messages = Counter(), Counter()
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError:
        return counts, messages
    for line in lines:
        # No field but the last (the message) holds a space; kubectl may align them with spaces.
        fields = line.split(None, 5)
        if len(fields) < 5 or fields[0] in ("csi-provisioner", "default", "kube-system"):
            continue
        namespace, kind_, reason, obj, component = fields[:5]
        if component.startswith("reference.csi.example.com"):
            reporter = "the provisioner sidecar"
        elif component.startswith("persistentvolume-controller"):
            reporter = component
        else:
            continue
        counts[(reporter, kind_, reason, obj)] += 1
        if kind_ == "Warning" and len(fields) == 6:
            messages[(reporter, reason, generic(fields[5]))] += 1
    return counts, messages


def generic(message):
    """A warning's text with the names that differ from run to run (namespaces, claims, volumes,
    snapshots, uids) replaced by `…`, so the two runs' texts can be compared."""
    message = re.sub(r"[a-z0-9.-]*[0-9][a-z0-9.-]*", "…", message)
    return message[:200]


def ginkgo_account(directory):
    """(exit status, specs ran) of one run, from hack/e2e.sh's ginkgo.status and Ginkgo's
    "Ran N of M Specs" line; (-1, -1) where either is missing."""
    try:
        status = int(open(f"{directory}/ginkgo.status", encoding="utf-8").read().strip())
    except (OSError, ValueError):
        status = -1
    ran = -1
    try:
        for line in open(f"{directory}/ginkgo.log", encoding="utf-8", errors="replace"):
            found = re.match(r"Ran (\d+) of \d+ Specs", line)
            if found:
                ran = int(found.group(1))
    except OSError:
        pass
    return status, ran


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


def read_side(directory):
    """(specs, event counts, warning counts, Ginkgo's account) of one run's directory."""
    path = f"{directory}/junit_01.xml"
    try:
        specs = outcomes(path)
    except (OSError, ET.ParseError) as e:
        print(f"no report at {path}: {e}", file=sys.stderr)
        specs = {}
    counts, messages = read_events(f"{directory}/events.tsv")
    return specs, counts, messages, ginkgo_account(directory)


def write_baseline(path, directory):
    """Keeps one run's outcomes in `path` (JSON, sorted, so that a new baseline's diff shows
    what changed); fails on a run that did not complete."""
    specs, counts, messages, (status, ran) = read_side(directory)
    counted = sum(1 for s, _ in specs.values() if kind(s) != "skip")
    if not specs or ran != counted:
        print(f"{directory}: not a complete run (ginkgo ran {ran}, report counts {counted})", file=sys.stderr)
        return 1
    baseline = {
        "ginkgo": {"status": status, "ran": ran},
        "specs": {name: list(outcome) for name, outcome in sorted(specs.items())},
        "events": sorted([*key, n] for key, n in counts.items()),
        "warnings": sorted([*key, n] for key, n in messages.items()),
    }
    with open(path, "w", encoding="utf-8") as out:
        json.dump(baseline, out, indent=1, ensure_ascii=False)
        out.write("\n")
    print(f"{path}: {len(specs)} specs, {ran} ran")
    return 0


def read_baseline(path):
    """What write_baseline kept, in read_side's shape."""
    with open(path, encoding="utf-8") as f:
        baseline = json.load(f)
    specs = {name: tuple(outcome) for name, outcome in baseline["specs"].items()}
    counts = Counter({tuple(row[:-1]): row[-1] for row in baseline["events"]})
    messages = Counter({tuple(row[:-1]): row[-1] for row in baseline["warnings"]})
    account = (baseline["ginkgo"]["status"], baseline["ginkgo"]["ran"])
    return specs, counts, messages, account


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "--write-baseline":
        return write_baseline(args[1], args[2])
    baseline = None
    if "--baseline" in args:
        at = args.index("--baseline")
        if at + 1 >= len(args):
            print(__doc__, file=sys.stderr)
            return 2
        baseline = args[at + 1]
        del args[at : at + 2]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    report_dir, sides = args[0], args[1:]
    read = {}
    for side in sides:
        if side == "upstream" and baseline is not None:
            read[side] = read_baseline(baseline)
        else:
            read[side] = read_side(f"{report_dir}/{side}")
    results = {side: specs for side, (specs, _, _, _) in read.items()}

    suites = sorted({suite_of(n) for specs in results.values() for n in specs})
    counts = {side: defaultdict(Counter) for side in sides}
    for side, specs in results.items():
        for name, (status, _) in specs.items():
            counts[side][suite_of(name)][kind(status)] += 1
            counts[side]["**total**"][kind(status)] += 1

    if baseline is not None and "upstream" in sides:
        print(f"Upstream's side is the baseline {baseline}, kept from a run of it (hack/e2e.sh --write-baseline).\n")
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

    events = {side: counts for side, (_, counts, _, _) in read.items()}
    warnings = {side: messages for side, (_, _, messages, _) in read.items()}
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
    print("\nTheir warnings' texts (names replaced by …):\n")
    print("| reported by | reason | text | " + " | ".join(sides) + " |")
    print("|" + "---|" * (3 + len(sides)))
    for key in sorted({k for messages in warnings.values() for k in messages}):
        counts = [warnings[side].get(key, 0) for side in sides]
        text = key[2].replace("|", "\\|")
        print(f"| {key[0]} | {key[1]} | {text} | " + " | ".join(map(str, counts)) + " |")

    verdict = 0
    # Ginkgo's own account: its exit status and "Ran N of M Specs" must agree with the specs
    # counted here (a run cut short reports the specs it never ran as skipped).
    for side in sides:
        status, ran = read[side][3]
        counted = sum(1 for s, _ in results[side].values() if kind(s) != "skip")
        if ran != counted:
            print(f"\n{side}: ginkgo ran {ran} specs, the report counts {counted}", file=sys.stderr)
            if side == "ours":
                verdict = 1
        if side == "ours" and status != 0:
            print(f"\nours: ginkgo exited {status}", file=sys.stderr)
            verdict = 1
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
