#!/usr/bin/python3
"""Checks a Chrome trace-event JSON file (such as ferry writes) against the format's rules.

  /usr/bin/python3 tests/tools/check_trace.py trace.json [--max-events N] [--expect-tids 0,1,2]

On success prints one line of JSON on stdout and exits 0:
  {"events": N, "by_tid": {"0": n, ...}, "names": {"sample": n, ...}, "metadata": m}
where "events", "by_tid" and "names" count the events that are not metadata ("M"), and
"metadata" counts those. On the first violation prints what and where on stderr and exits 1
(2: a usage error).

Rules:
  - the top level is an object with "traceEvents", a list ("displayTimeUnit", where present,
    is "ms" or "ns");
  - every event is an object with "ph" (one of X B E b e n i I M C), "name" (a string), and
    "pid" and "tid" (integers);
  - every event but "M" has a numeric "ts" >= 0; "X" has a numeric "dur" >= 0;
  - "b", "e" and "n" have "cat" (a string) and "id" (a string or an integer);
  - "i" and "I" may have "s", which is then "g", "p" or "t";
  - "M" has "args", an object with "name" (a string for "process_name" and "thread_name"),
    except the sort-order metadata "process_sort_index" and "thread_sort_index", whose "args"
    have an integer "sort_index" instead (ferry writes "thread_sort_index" for its workers).
--max-events N: fails when there are more than N events (not counting "M").
--expect-tids 0,1,2: fails unless each tid listed has at least one "X" event.
"""

import argparse
import json
import math
import sys

PHASES = {"X", "B", "E", "b", "e", "n", "i", "I", "M", "C"}
INSTANT_SCOPES = {"g", "p", "t"}
NAME_METADATA = {"process_name", "thread_name"}  # "args": {"name": a string}
SORT_METADATA = {"process_sort_index", "thread_sort_index"}  # "args": {"sort_index": an int}


class TraceError(Exception):
    pass


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def describe(v):
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


def check_event(i, e):
    where = f"traceEvents[{i}]"
    if not isinstance(e, dict):
        raise TraceError(f"{where}: an event must be an object, not {describe(e)}")
    ph = e.get("ph")
    if "ph" not in e:
        raise TraceError(f"{where}: no \"ph\" in {describe(e)}")
    if ph not in PHASES:
        raise TraceError(
            f"{where}: \"ph\" is {describe(ph)}; expected one of {' '.join(sorted(PHASES))}"
        )
    where += f' ("ph": "{ph}")'
    if not isinstance(e.get("name"), str):
        raise TraceError(f"{where}: \"name\" must be a string, not {describe(e.get('name'))}"
                         if "name" in e else f"{where}: no \"name\"")
    where += f" {describe(e['name'])}"
    for field in ("pid", "tid"):
        if field not in e:
            raise TraceError(f"{where}: no \"{field}\"")
        if not is_int(e[field]):
            raise TraceError(f"{where}: \"{field}\" must be an integer, not {describe(e[field])}")
    if ph != "M":
        if "ts" not in e:
            raise TraceError(f"{where}: no \"ts\"")
        if not is_number(e["ts"]) or e["ts"] < 0:
            raise TraceError(f"{where}: \"ts\" must be a number >= 0, not {describe(e['ts'])}")
    if ph == "X":
        if "dur" not in e:
            raise TraceError(f"{where}: no \"dur\" (an \"X\" event needs one)")
        if not is_number(e["dur"]) or e["dur"] < 0:
            raise TraceError(f"{where}: \"dur\" must be a number >= 0, not {describe(e['dur'])}")
    elif ph in ("b", "e", "n"):
        if not isinstance(e.get("cat"), str):
            raise TraceError(f"{where}: an async event needs \"cat\", a string"
                             + (f", not {describe(e['cat'])}" if "cat" in e else ""))
        ident = e.get("id")
        if not (isinstance(ident, str) or is_int(ident)):
            raise TraceError(f"{where}: an async event needs \"id\", a string or an integer"
                             + (f", not {describe(ident)}" if "id" in e else ""))
    elif ph in ("i", "I"):
        if "s" in e and e["s"] not in INSTANT_SCOPES:
            raise TraceError(
                f"{where}: \"s\" is {describe(e['s'])}; expected \"g\", \"p\" or \"t\""
            )
    elif ph == "M":
        args = e.get("args")
        if not isinstance(args, dict):
            raise TraceError(f"{where}: a metadata event needs \"args\", an object"
                             + (f", not {describe(args)}" if "args" in e else ""))
        if e["name"] in SORT_METADATA:
            if not is_int(args.get("sort_index")):
                raise TraceError(f"{where}: its \"args\" need \"sort_index\", an integer"
                                 + (f", not {describe(args['sort_index'])}"
                                    if "sort_index" in args else ""))
        elif "name" not in args:
            raise TraceError(f"{where}: a metadata event's \"args\" needs \"name\"")
        elif e["name"] in NAME_METADATA and not isinstance(args["name"], str):
            raise TraceError(f"{where}: \"args\": \"name\" must be a string, not "
                             f"{describe(args['name'])}")


def check(doc, max_events=None, expect_tids=()):
    """The summary of a trace document (parsed JSON); raises TraceError on the first violation."""
    if not isinstance(doc, dict):
        raise TraceError("the top level must be an object with \"traceEvents\"")
    if "traceEvents" not in doc:
        raise TraceError("no \"traceEvents\" at the top level")
    events = doc["traceEvents"]
    if not isinstance(events, list):
        raise TraceError(f"\"traceEvents\" must be a list, not {describe(events)}")
    if "displayTimeUnit" in doc and doc["displayTimeUnit"] not in ("ms", "ns"):
        raise TraceError(f"\"displayTimeUnit\" is {describe(doc['displayTimeUnit'])}; "
                         "expected \"ms\" or \"ns\"")
    count = 0
    metadata = 0
    by_tid = {}
    names = {}
    x_by_tid = {}
    for i, e in enumerate(events):
        check_event(i, e)
        if e["ph"] == "M":
            metadata += 1
            continue
        count += 1
        if max_events is not None and count > max_events:
            raise TraceError(f"more than {max_events} events (not counting \"M\"): "
                             f"traceEvents[{i}] is number {count}")
        tid = str(e["tid"])
        by_tid[tid] = by_tid.get(tid, 0) + 1
        names[e["name"]] = names.get(e["name"], 0) + 1
        if e["ph"] == "X":
            x_by_tid[e["tid"]] = x_by_tid.get(e["tid"], 0) + 1
    for tid in expect_tids:
        if x_by_tid.get(tid, 0) == 0:
            have = ", ".join(str(t) for t in sorted(x_by_tid)) or "none"
            raise TraceError(f"tid {tid} has no \"X\" event (tids with \"X\" events: {have})")
    return {
        "events": count,
        "by_tid": dict(sorted(by_tid.items(), key=lambda kv: int(kv[0]))),
        "names": dict(sorted(names.items())),
        "metadata": metadata,
    }


def reject_constant(name):
    raise TraceError(f"{name} is not a JSON number (the file has a bare {name})")


def parse_tids(text):
    try:
        tids = [int(t) for t in text.split(",") if t.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers separated by commas")
    if not tids:
        raise argparse.ArgumentTypeError("expected at least one tid")
    return tids


def non_negative(text):
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0")
    return n


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Check a Chrome trace-event JSON file; print a one-line JSON summary."
    )
    parser.add_argument("trace", metavar="TRACE.json")
    parser.add_argument("--max-events", type=non_negative, metavar="N",
                        help="fail when there are more than N events (not counting \"M\")")
    parser.add_argument("--expect-tids", type=parse_tids, default=[], metavar="0,1,2",
                        help="fail unless each of these tids has at least one \"X\" event")
    args = parser.parse_args(argv)
    try:
        try:
            with open(args.trace, encoding="utf-8") as f:
                doc = json.load(f, parse_constant=reject_constant)
        except FileNotFoundError:
            raise TraceError("no such file")
        except IsADirectoryError:
            raise TraceError("is a directory, not a trace file")
        except UnicodeDecodeError as e:
            raise TraceError(f"not UTF-8: {e}")
        except json.JSONDecodeError as e:
            raise TraceError(f"not valid JSON: {e}")
        except OSError as e:
            raise TraceError(str(e.strerror or e))
        summary = check(doc, args.max_events, args.expect_tids)
    except TraceError as e:
        print(f"check_trace.py: {args.trace}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
