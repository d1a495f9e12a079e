#!/usr/bin/python3
"""A Chrome trace-event JSON file (such as ferry writes) as an SVG timeline picture.

  /usr/bin/python3 bench/trace_picture.py trace.json                 # the first 200 ms
  /usr/bin/python3 bench/trace_picture.py trace.json -o t.svg --from-ms 1000 --to-ms 1050
  /usr/bin/python3 bench/trace_picture.py trace.json --all           # the whole trace

One row per thread (tid), named by its "thread_name" metadata event, in tid order (or
"thread_sort_index" where given). "X" events (and "B"/"E" pairs) are boxes coloured by name
(sample, collate, load, wait, ...), stacked in lanes where they overlap; instant events ("i"/"I")
are thin vertical marks with their name, across every row for global and process scope, in their
thread's row for thread scope; async spans ("b"/"e", such as a batch from dispatch to delivery)
get a row of their own per category and name. Times are in ms since the trace's first event,
as Chrome's and Perfetto's viewers show them. Hover a box for its times and args.

The window: by default the first 200 ms (--window-ms) after the first event, so that boxes are
wide enough to see; --from-ms A and --to-ms B choose another (either alone: a window of
--window-ms from A, or from 0 to B); --all draws everything. Boxes narrower than a pixel are
gathered per pixel column (coloured by the name that takes most of its time, paler the less busy
it is; the tooltip counts them), so a dense window still makes a small file. 960 px wide; the
height follows the rows. Standard library only. Default output: TRACE with .svg; "-o -": stdout.
"""

import argparse
import json
import math
import os
import sys
import zlib
from xml.sax.saxutils import escape

WIDTH = 960
LABEL_W = 150  # the row names' column
X0, X1 = 160, WIDTH - 16  # the time axis
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
LANE_H = 16  # one lane of boxes
BOX_H = 13
MAX_LANES = 8  # overlapping boxes beyond this share the last lane
ASYNC_LANE_H = 9
MAX_ASYNC_LANES = 16
ROW_PAD = 6
HALO = "stroke='white' stroke-width='2.5' paint-order='stroke'"  # labels over boxes stay legible

# Colours of the names ferry writes; other names get one from PALETTE by a hash of the name.
NAME_COLOURS = {
    "sample": "#4e79a7",
    "collate": "#f28e2b",
    "load": "#59a14f",
    "wait": "#e15759",
    "batch": "#76b7b2",
    "error": "#d62728",
    "worker restart": "#ff7f0e",
    "skipped": "#9467bd",
}
PALETTE = ["#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#86bcb6", "#8cd17d",
           "#d4a6c8", "#499894", "#f1ce63", "#a0cbe8", "#ffbe7d"]


class PictureError(Exception):
    pass


def colour_of(name):
    if name in NAME_COLOURS:
        return NAME_COLOURS[name]
    if name.startswith("epoch"):
        return "#555555"
    return PALETTE[zlib.crc32(name.encode("utf-8")) % len(PALETTE)]


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise PictureError(f"{path}: no such file")
    except IsADirectoryError:
        raise PictureError(f"{path}: is a directory, not a trace file")
    except json.JSONDecodeError as e:
        raise PictureError(f"{path}: not valid JSON: {e}")
    except OSError as e:
        raise PictureError(f"{path}: {e.strerror or e}")
    if isinstance(doc, list):  # the trace-event format's array form
        return {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise PictureError(f"{path}: not a trace-event file (no \"traceEvents\" list)")
    return doc


class Trace:
    """The events of a trace, sorted into threads, async spans and instants."""

    def __init__(self, doc):
        self.other = doc.get("otherData") if isinstance(doc.get("otherData"), dict) else {}
        self.thread_names = {}  # (pid, tid) -> name
        self.sort_index = {}  # (pid, tid) -> int
        self.process_names = {}  # pid -> name
        self.boxes = {}  # (pid, tid) -> [(ts, dur, name, args)]
        self.instants = []  # (ts, name, scope, (pid, tid), args)
        self.async_spans = {}  # (cat, name) -> [(ts, end, id, args)]
        self.async_marks = {}  # (cat, name) -> [(ts, id, name)]
        self.threads = set()
        open_b = {}  # (pid, tid) -> stack of (ts, name, args): "B" waiting for its "E"
        open_async = {}  # (pid, cat, id, name) -> (ts, args)
        self.first = math.inf
        self.last = -math.inf
        # In time order (metadata first), as the viewers pair "B"/"E" and "b"/"e": a writer may
        # flush its threads' buffers one after another.
        events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
        self.skipped = len(doc["traceEvents"]) - len(events)
        events.sort(key=lambda e: e.get("ts") if is_number(e.get("ts")) else -math.inf)
        for e in events:
            if not isinstance(e.get("ph"), str):
                self.skipped += 1
                continue
            ph = e["ph"]
            key = (e.get("pid", 0), e.get("tid", 0))
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in key):
                self.skipped += 1
                continue
            name = str(e.get("name", ""))
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            if ph == "M":
                if name == "thread_name" and "name" in args:
                    self.thread_names[key] = str(args["name"])
                    self.threads.add(key)
                elif name == "thread_sort_index" and is_number(args.get("sort_index")):
                    self.sort_index[key] = args["sort_index"]
                elif name == "process_name" and "name" in args:
                    self.process_names[key[0]] = str(args["name"])
                continue
            ts = e.get("ts")
            if not is_number(ts):
                self.skipped += 1
                continue
            self.first = min(self.first, ts)
            self.last = max(self.last, ts)
            if ph == "X":
                dur = e.get("dur") if is_number(e.get("dur")) else 0
                self.boxes.setdefault(key, []).append((ts, max(0, dur), name, args))
                self.threads.add(key)
                self.last = max(self.last, ts + max(0, dur))
            elif ph == "B":
                open_b.setdefault(key, []).append((ts, name, args))
                self.threads.add(key)
            elif ph == "E":
                stack = open_b.get(key)
                if stack:
                    begin, begin_name, begin_args = stack.pop()
                    self.boxes.setdefault(key, []).append(
                        (begin, ts - begin, begin_name, {**begin_args, **args}))
            elif ph in ("i", "I"):
                scope = e.get("s", "t")
                self.instants.append((ts, name, scope, key, args))
                if scope == "t":
                    self.threads.add(key)
            elif ph in ("b", "e", "n"):
                cat = str(e.get("cat", ""))
                ident = e.get("id", e.get("id2", ""))
                akey = (key[0], cat, str(ident), name)
                if ph == "b":
                    open_async[akey] = (ts, args)
                elif ph == "e":
                    if akey in open_async:
                        begin, begin_args = open_async.pop(akey)
                        self.async_spans.setdefault((cat, name), []).append(
                            (begin, ts, str(ident), {**begin_args, **args}))
                else:
                    self.async_marks.setdefault((cat, name), []).append((ts, str(ident), name))
            # "C" counters and other phases are not drawn.
        # What never ended runs to the end of the trace.
        for key, stack in open_b.items():
            for begin, name, args in stack:
                self.boxes.setdefault(key, []).append((begin, self.last - begin, name, args))
        for (_, cat, ident, name), (begin, args) in open_async.items():
            self.async_spans.setdefault((cat, name), []).append(
                (begin, self.last, ident, {**args, "unfinished": True}))
        if self.first == math.inf:
            raise PictureError("the trace has no timed events (every event lacks a numeric ts)")

    def thread_order(self):
        def order(key):
            return (key[0], self.sort_index.get(key, key[1]), key[1])

        return sorted(self.threads, key=order)

    def thread_label(self, key):
        label = self.thread_names.get(key, f"tid {key[1]}")
        if len({k[0] for k in self.threads}) > 1:
            label = f"{self.process_names.get(key[0], f'pid {key[0]}')}: {label}"
        return label


def lanes_for(intervals):
    """A lane per interval: the lowest whose previous interval has ended (greedy colouring).

    An interval may start up to 0.01 µs before the previous one in its lane ends: timestamps
    and durations written with 3 decimals round apart.
    """
    ends = []
    lanes = []
    for start, end in intervals:
        for i, e in enumerate(ends):
            if e <= start + 0.01:
                ends[i] = end
                lanes.append(i)
                break
        else:
            ends.append(end)
            lanes.append(len(ends) - 1)
    return lanes


def nice_step(span, target):
    raw = span / target
    base = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * base >= raw:
            return m * base
    return 10 * base


def fmt_ms(v, step=None):
    if step is None:
        return f"{v:.3f}".rstrip("0").rstrip(".")
    decimals = 0
    while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-9:
        decimals += 1
    return f"{v:.{decimals}f}"


def text_fits(text, size, width):
    return len(text) * size * 0.55 <= width


def args_text(args):
    if not args:
        return ""
    return " " + json.dumps(args, separators=(", ", ": "))[:300]


def lane_svg(items, top, box_h, t0, sx, clip, us_per_px, legend_names, thread):
    """The SVG of one lane's boxes: items (ts, end, name, args, ident) in time order.

    Boxes a pixel wide or more are drawn one by one, labelled where the label fits (thread rows:
    the name, with the sample's index or the batch; async rows: the id). Narrower ones are
    gathered per pixel column, coloured by the name that takes most of the column's time, and
    neighbouring columns of one name make one box whose tooltip counts the events, paler the less
    of its time they fill; so a window of a million events makes a picture of a few thousand
    shapes.
    """
    out = []
    columns = {}  # pixel -> {name: [count, total µs, first ts, last end]}
    for ts, end, name, args, ident in items:
        xa, xb = sx(clip(ts)), sx(clip(end))
        legend_names.setdefault(name, colour_of(name))
        if xb - xa < 1:
            stats = columns.setdefault(int(xa), {}).setdefault(name, [0, 0.0, ts, end])
            stats[0] += 1
            stats[1] += end - ts
            stats[2] = min(stats[2], ts)
            stats[3] = max(stats[3], end)
            continue
        colour = colour_of(name)
        start_ms, end_ms = (ts - t0) / 1e3, (end - t0) / 1e3
        what = f"{name} {ident}" if ident is not None else name
        tip = f"{what}: {fmt_ms(start_ms)} to {fmt_ms(end_ms)} ms ({fmt_ms(end_ms - start_ms)} ms)"
        tip += args_text(args)
        w = xb - xa
        if thread:
            out.append(
                f"<rect x='{xa:.2f}' y='{top:.1f}' width='{w:.2f}' height='{box_h}' "
                f"fill='{colour}' stroke='white' stroke-width='{0.5 if w > 3 else 0}'>"
                f"<title>{escape(tip)}</title></rect>"
            )
            key_arg = "index" if "index" in args else "batch" if "batch" in args else None
            labels = ([f"{name} {args[key_arg]}"] if key_arg else []) + [name]
            for label in labels:
                if text_fits(label, 9.5, w - 4):
                    out.append(
                        f"<text x='{xa + 2:.2f}' y='{top + 9.8:.1f}' {FONT} font-size='9.5' "
                        f"fill='white' pointer-events='none'>{escape(label)}</text>"
                    )
                    break
        else:
            out.append(
                f"<rect x='{xa:.2f}' y='{top:.1f}' width='{w:.2f}' height='{box_h}' rx='2' "
                f"fill='{colour}' fill-opacity='0.85'><title>{escape(tip)}</title></rect>"
            )
            if ident is not None and len(ident) * 7.5 * 0.64 <= w - 4:  # digits are wide
                out.append(
                    f"<text x='{xa + 2:.2f}' y='{top + 6.3:.1f}' {FONT} font-size='7.5' "
                    f"fill='#123' pointer-events='none'>{escape(ident)}</text>"
                )
    # The narrow ones: runs of neighbouring columns whose main name is the same.
    runs = []  # [first pixel, last pixel, name, {name: stats}]
    for pixel in sorted(columns):
        names = columns[pixel]
        main = max(names, key=lambda n: names[n][1])
        if runs and runs[-1][2] == main and pixel <= runs[-1][1] + 1:
            run = runs[-1]
            run[1] = pixel
            for n, (count, total, first, last) in names.items():
                merged = run[3].setdefault(n, [0, 0.0, first, last])
                merged[0] += count
                merged[1] += total
                merged[2] = min(merged[2], first)
                merged[3] = max(merged[3], last)
        else:
            runs.append([pixel, pixel, main, {n: list(v) for n, v in names.items()}])
    for first_px, last_px, main, names in runs:
        first = min(v[2] for v in names.values())
        last = max(v[3] for v in names.values())
        busy = sum(v[1] for v in names.values()) / ((last_px - first_px + 1) * us_per_px)
        counts = ", ".join(f"{v[0]} x {n}" for n, v in sorted(names.items()))
        tip = (f"{counts}: {fmt_ms((first - t0) / 1e3)} to {fmt_ms((last - t0) / 1e3)} ms, "
               f"{min(busy, 1) * 100:.0f}% busy")
        opacity = max(0.3, min(busy, 1.0)) * (1.0 if thread else 0.85)
        out.append(
            f"<rect x='{first_px}' y='{top:.1f}' width='{last_px - first_px + 1}' "
            f"height='{box_h}' fill='{colour_of(main)}' fill-opacity='{opacity:.2f}'>"
            f"<title>{escape(tip)}</title></rect>"
        )
    return out


def render(trace, source, from_ms, to_ms):
    t0 = trace.first
    lo, hi = t0 + from_ms * 1e3, t0 + to_ms * 1e3  # µs
    scale = (X1 - X0) / (hi - lo)

    def sx(ts):
        return X0 + (ts - lo) * scale

    def clip(ts):
        return min(max(ts, lo), hi)

    body = []  # drawn after the height is known
    legend_names = {}  # name -> colour, for the boxes in the window (marks carry their names)

    # Global instant labels go in a band above the rows, in up to 3 levels.
    global_instants = [i for i in trace.instants if i[2] in ("g", "p") and lo <= i[0] <= hi]
    band_levels = []
    band_labels = []  # (x, left edge, level, name, colour, args)
    for ts, name, _, _, args in sorted(global_instants, key=lambda i: i[0]):
        x = sx(ts)
        width = len(name) * 10 * 0.55 + 6
        left = x if x + width <= WIDTH - 4 else x - width  # near the right edge: to the left
        for level, right in enumerate(band_levels):
            if left >= right:
                band_levels[level] = left + width
                band_labels.append((x, left, level, name, colour_of(name), args))
                break
        else:
            if len(band_levels) < 3:
                band_levels.append(left + width)
                band_labels.append((x, left, len(band_levels) - 1, name, colour_of(name), args))
    band_h = 13 * len(band_levels) + (4 if band_levels else 0)

    title_h = 50
    axis_y = title_h + 18  # the tick labels sit above this line
    rows_top = axis_y + 6 + band_h

    # Thread rows.
    rows = []  # (label, top, height, (pid, tid) or None)
    y = rows_top
    for key in trace.thread_order():
        events = sorted(trace.boxes.get(key, []), key=lambda e: (e[0], -e[1]))
        lanes = lanes_for([(ts, ts + dur) for ts, dur, _, _ in events])
        visible = [(e, min(lane, MAX_LANES - 1)) for e, lane in zip(events, lanes)
                   if e[0] <= hi and e[0] + e[1] >= lo]
        n_lanes = max([lane for _, lane in visible], default=0) + 1
        height = n_lanes * LANE_H + ROW_PAD
        rows.append((trace.thread_label(key), y, height, key))
        by_lane = {}
        for (ts, dur, name, args), lane in visible:
            by_lane.setdefault(lane, []).append((ts, ts + dur, name, args, None))
        for lane, items in sorted(by_lane.items()):
            top = y + ROW_PAD / 2 + lane * LANE_H + (LANE_H - BOX_H) / 2
            body.extend(lane_svg(items, top, BOX_H, t0, sx, clip, 1 / scale, legend_names,
                                 thread=True))
        # Thread-scoped instants: a mark in this row (one per pixel column and name, counting
        # them), labelled where there is room.
        label_right = -math.inf
        marks = {}  # (pixel, name) -> [ts, args, count]
        for ts, name, scope, ikey, args in sorted(trace.instants, key=lambda i: i[0]):
            if scope not in ("g", "p") and ikey == key and lo <= ts <= hi:
                marks.setdefault((int(sx(ts)), name), [ts, args, 0])[2] += 1
        for (_, name), (ts, args, count) in sorted(marks.items(), key=lambda m: m[1][0]):
            x = sx(ts)
            colour = colour_of(name)
            tip = f"{name}: {fmt_ms((ts - t0) / 1e3)} ms" + args_text(args)
            if count > 1:
                tip = f"{count} x {name}, the first at {fmt_ms((ts - t0) / 1e3)} ms"
            body.append(
                f"<line x1='{x:.2f}' y1='{y + 1}' x2='{x:.2f}' y2='{y + height - 1}' "
                f"stroke='{colour}' stroke-width='1.5'><title>{escape(tip)}</title></line>"
            )
            width = len(name) * 9 * 0.55 + 6
            if x > label_right:
                right_side = x + width <= WIDTH - 4
                body.append(
                    f"<text x='{x + 2 if right_side else x - 2:.2f}' y='{y + 9}' {FONT} "
                    f"font-size='9' fill='{colour}' "
                    f"text-anchor='{'start' if right_side else 'end'}' {HALO}>"
                    f"{escape(name)}</text>"
                )
                label_right = x + width
        y += height

    # Async spans: a row per (category, name), lanes packed.
    for (cat, name), spans in sorted(trace.async_spans.items()):
        spans = sorted(spans)
        lanes = lanes_for([(b, e) for b, e, _, _ in spans])
        visible = [(s, lane) for s, lane in zip(spans, lanes) if s[0] <= hi and s[1] >= lo]
        n_lanes = min(max([lane for _, lane in visible], default=0) + 1, MAX_ASYNC_LANES)
        height = n_lanes * ASYNC_LANE_H + ROW_PAD
        label = f"{cat}: {name} (async)" if cat and cat != name else f"{name} (async)"
        rows.append((label, y, height, None))
        colour = colour_of(name)
        if visible:
            legend_names.setdefault(name, colour)
        by_lane = {}
        for (begin, end, ident, args), lane in visible:
            by_lane.setdefault(min(lane, MAX_ASYNC_LANES - 1), []).append(
                (begin, end, name, args, ident if lane < MAX_ASYNC_LANES - 1 else None))
        for lane, items in sorted(by_lane.items()):
            top = y + ROW_PAD / 2 + lane * ASYNC_LANE_H + 1
            body.extend(lane_svg(items, top, ASYNC_LANE_H - 2, t0, sx, clip, 1 / scale,
                                 legend_names, thread=False))
        for ts, ident, mark_name in trace.async_marks.get((cat, name), []):
            if lo <= ts <= hi:
                x = sx(ts)
                body.append(
                    f"<line x1='{x:.2f}' y1='{y + 1}' x2='{x:.2f}' y2='{y + height - 1}' "
                    f"stroke='#333' stroke-width='1'><title>{escape(f'{mark_name} {ident}')}"
                    f"</title></line>"
                )
        y += height
    for (cat, name), marks in sorted(trace.async_marks.items()):  # "n" without a span row
        if (cat, name) not in trace.async_spans:
            visible = [m for m in marks if lo <= m[0] <= hi]
            rows.append((f"{name} (async)", y, LANE_H + ROW_PAD, None))
            for ts, ident, mark_name in visible:
                x = sx(ts)
                body.append(
                    f"<line x1='{x:.2f}' y1='{y + 2}' x2='{x:.2f}' y2='{y + LANE_H + ROW_PAD - 2}' "
                    f"stroke='#333' stroke-width='1'><title>{escape(f'{mark_name} {ident}')}"
                    f"</title></line>"
                )
            y += LANE_H + ROW_PAD
    rows_bottom = y

    # Global and process instants: a line across every row (one per pixel column and name), the
    # label in the band above.
    marks = {}  # (pixel, name) -> [ts, args, count]
    for ts, name, scope, _, args in sorted(trace.instants, key=lambda i: i[0]):
        if scope in ("g", "p") and lo <= ts <= hi:
            marks.setdefault((int(sx(ts)), name), [ts, args, 0])[2] += 1
    for (_, name), (ts, args, count) in marks.items():
        x = sx(ts)
        colour = colour_of(name)
        tip = f"{name}: {fmt_ms((ts - t0) / 1e3)} ms" + args_text(args)
        if count > 1:
            tip = f"{count} x {name}, the first at {fmt_ms((ts - t0) / 1e3)} ms"
        body.append(
            f"<line x1='{x:.2f}' y1='{axis_y}' x2='{x:.2f}' y2='{rows_bottom}' "
            f"stroke='{colour}' stroke-width='1.2' stroke-dasharray='3 2'>"
            f"<title>{escape(tip)}</title></line>"
        )
    for x, left, level, name, colour, _ in band_labels:
        anchor = "start" if left >= x else "end"
        body.append(
            f"<text x='{x + 2 if left >= x else x - 2:.2f}' y='{axis_y + 6 + 10 + 13 * level}' "
            f"{FONT} font-size='10' fill='{colour}' text-anchor='{anchor}' {HALO}>"
            f"{escape(name)}</text>"
        )

    # Legend, wrapped to the width.
    legend_y = rows_bottom + 40
    legend = []
    lx = X0
    for name, colour in legend_names.items():
        width = 16 + len(name) * 11 * 0.55 + 18
        if lx + width > X1 and lx > X0:
            lx = X0
            legend_y += 18
        legend.append(
            f"<rect x='{lx:.1f}' y='{legend_y - 9}' width='12' height='11' fill='{colour}'/>"
            f"<text x='{lx + 16:.1f}' y='{legend_y}' {FONT} font-size='11' fill='#222'>"
            f"{escape(name)}</text>"
        )
        lx += width
    height = legend_y + 16

    # The frame: title, axis, grid, row backgrounds and names.
    duration_ms = (trace.last - trace.first) / 1e3
    head = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height:.0f}' "
        f"viewBox='0 0 {WIDTH} {height:.0f}'>",
        f"<rect width='{WIDTH}' height='{height:.0f}' fill='white'/>",
        f"<text x='12' y='22' {FONT} font-size='15' font-weight='bold' fill='#222'>"
        f"{escape(os.path.basename(source))}: {fmt_ms(from_ms)} to {fmt_ms(to_ms)} ms"
        f"</text>",
    ]
    info = f"the trace spans {fmt_ms(duration_ms)} ms; times in ms since its first event"
    producer = trace.other.get("producer")
    if producer:
        info = f"{producer}; " + info
    dropped = trace.other.get("dropped")
    head.append(f"<text x='12' y='40' {FONT} font-size='11' fill='#555'>{escape(info)}")
    if is_number(dropped) and dropped > 0:
        capacity = trace.other.get("capacity")
        cap = f" (capacity {capacity:g})" if is_number(capacity) else ""
        head.append(f"<tspan fill='#c00'>; {dropped:g} events dropped{escape(cap)}</tspan>")
    head.append("</text>")
    for i, (label, top, h, key) in enumerate(rows):
        if i % 2 == 0:
            head.append(f"<rect x='0' y='{top}' width='{WIDTH}' height='{h}' fill='#f4f5f7'/>")
        shown = label
        if not text_fits(label, 11, LABEL_W - 12):
            shown = label[: int((LABEL_W - 12) / 6) - 1] + "\u2026"
        head.append(
            f"<text x='{LABEL_W - 4}' y='{top + min(h / 2, LANE_H / 2 + ROW_PAD / 2) + 4:.1f}' "
            f"{FONT} font-size='11' fill='#222' text-anchor='end'>{escape(shown)}"
            f"<title>{escape(label + (f' (pid {key[0]}, tid {key[1]})' if key else ''))}"
            f"</title></text>"
        )
    step = nice_step(to_ms - from_ms, 10)
    tick = math.ceil(from_ms / step) * step
    while tick <= to_ms + step * 1e-9:
        x = X0 + (tick - from_ms) / (to_ms - from_ms) * (X1 - X0)
        head.append(
            f"<line x1='{x:.2f}' y1='{axis_y}' x2='{x:.2f}' y2='{rows_bottom}' stroke='#dddddd' "
            f"stroke-width='1'/>"
            f"<line x1='{x:.2f}' y1='{axis_y - 4}' x2='{x:.2f}' y2='{axis_y}' stroke='#777'/>"
            f"<text x='{x:.2f}' y='{axis_y - 7}' {FONT} font-size='10' fill='#444' "
            f"text-anchor='middle'>{escape(fmt_ms(tick, step))}</text>"
        )
        tick += step
    head.append(
        f"<line x1='{X0}' y1='{axis_y}' x2='{X1}' y2='{axis_y}' stroke='#777' stroke-width='1'/>"
        f"<line x1='{X0}' y1='{rows_bottom}' x2='{X1}' y2='{rows_bottom}' stroke='#bbb'/>"
        f"<text x='{(X0 + X1) / 2:.1f}' y='{rows_bottom + 18}' {FONT} font-size='11' "
        f"fill='#444' text-anchor='middle'>time since the first event (ms)</text>"
    )
    return "\n".join(head + body + legend + ["</svg>"]) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Draw a Chrome trace-event JSON file as an SVG timeline (one row per thread)."
    )
    parser.add_argument("trace", metavar="TRACE.json")
    parser.add_argument("-o", "--output", metavar="OUT.svg",
                        help="where to write the SVG (default: TRACE with .svg; -: stdout)")
    parser.add_argument("--from-ms", type=float, metavar="A",
                        help="the window's start, in ms since the first event (default: 0)")
    parser.add_argument("--to-ms", type=float, metavar="B",
                        help="the window's end, in ms since the first event "
                        "(default: the start + --window-ms)")
    parser.add_argument("--window-ms", type=float, default=200.0, metavar="W",
                        help="the window's length when --to-ms is not given (default: 200)")
    parser.add_argument("--all", action="store_true", help="draw the whole trace")
    args = parser.parse_args(argv)
    if args.all and (args.from_ms is not None or args.to_ms is not None):
        parser.error("--all and --from-ms/--to-ms: choose one")
    if not args.window_ms > 0:
        parser.error("--window-ms: expected a positive number of ms")
    try:
        try:
            trace = Trace(load(args.trace))
        except PictureError as e:
            raise PictureError(str(e) if str(e).startswith(args.trace) else f"{args.trace}: {e}")
        span_ms = (trace.last - trace.first) / 1e3
        if args.all:
            from_ms, to_ms = 0.0, span_ms
        else:
            from_ms = args.from_ms if args.from_ms is not None else 0.0
            if args.to_ms is not None:
                to_ms = args.to_ms
            elif args.from_ms is None:  # the default window, no longer than the trace
                to_ms = min(args.window_ms, span_ms) if span_ms > 0 else args.window_ms
            else:
                to_ms = from_ms + args.window_ms
        if to_ms <= from_ms:
            if args.all:
                to_ms = from_ms + 1.0  # a trace of one instant
            else:
                raise PictureError(f"the window {from_ms:g} to {to_ms:g} ms is empty: "
                                   "--to-ms must be above --from-ms")
        svg = render(trace, args.trace, from_ms, to_ms)
    except PictureError as e:
        print(f"trace_picture.py: {e}", file=sys.stderr)
        return 1
    output = args.output or os.path.splitext(args.trace)[0] + ".svg"
    if output != "-" and os.path.abspath(output) == os.path.abspath(args.trace):
        print(f"trace_picture.py: {output}: the output would replace the input; give -o",
              file=sys.stderr)
        return 1
    if output == "-":
        sys.stdout.write(svg)
        return 0
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(svg)
    except OSError as e:
        print(f"trace_picture.py: {output}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"wrote {output} ({fmt_ms(from_ms)} to {fmt_ms(to_ms)} ms of "
          f"{fmt_ms(span_ms)})", file=sys.stderr)
    if trace.skipped:
        print(f"trace_picture.py: {trace.skipped} malformed events were left out "
              "(tests/tools/check_trace.py says which)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
