#!/usr/bin/python3
"""Throughput against num_workers, from ferry_loader_bench --json, as an SVG line chart.

  build/bench/ferry_loader_bench --workloads tensor --workers 1,2,4,8 --repeat 3 --json t.json
  /usr/bin/python3 bench/plot_workers.py t.json -o t.svg [--workload tensor]

One line per loader (ferry, PyTorch's DataLoader, LibTorch's thread loader) through the medians,
each run's value as a faint dot when --repeat > 1, for one workload (default: tensor if the file
has it, else its first). The caption gives the machine and the benchmark's command. The SVG is
written by hand (standard library only), 720x420. Default output: FILE with .svg; "-o -" writes
to stdout.
"""

import argparse
import json
import math
import os
import sys
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 720, 420
# The plot area; the legend sits to its right, the caption below the x axis label.
LEFT, RIGHT, TOP, BOTTOM = 78, 548, 48, 318
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
MONO = "font-family='DejaVu Sans Mono, Menlo, Consolas, monospace'"

# Known loaders: legend label, colour, marker (distinct shapes, not only colours).
LOADERS = {
    "ferry": ("ferry", "#1f77b4", "circle"),
    "pytorch": ("PyTorch", "#ff7f0e", "square"),
    "libtorch": ("LibTorch threads", "#2ca02c", "triangle"),
}
OTHER_COLOURS = ["#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


class PlotError(Exception):
    pass


def load(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise PlotError(f"{path}: no such file")
    except IsADirectoryError:
        raise PlotError(f"{path}: is a directory, not a JSON file")
    except json.JSONDecodeError as e:
        raise PlotError(f"{path}: not valid JSON: {e}")
    except OSError as e:
        raise PlotError(f"{path}: {e.strerror or e}")
    if not isinstance(doc, dict) or doc.get("format") != "ferry.loader_bench":
        raise PlotError(
            f"{path}: not a ferry_loader_bench --json file (no \"format\": \"ferry.loader_bench\")"
        )
    if doc.get("version") != 1:
        raise PlotError(f"{path}: format version {doc.get('version')!r}; this script reads 1")
    results = doc.get("results")
    if not isinstance(results, list):
        raise PlotError(f"{path}: \"results\" is missing or not a list")
    for i, r in enumerate(results):
        if not isinstance(r, dict) or not all(k in r for k in ("workload", "loader", "workers")):
            raise PlotError(f"{path}: results[{i}] lacks workload, loader or workers")
    return doc


def workloads_in(results):
    seen = []
    for r in results:
        if r["workload"] not in seen:
            seen.append(r["workload"])
    return seen


def choose_workload(path, results, wanted):
    present = workloads_in(results)
    if not present:
        raise PlotError(f"{path}: no results")
    if wanted is None:
        return "tensor" if "tensor" in present else present[0]
    if wanted not in present:
        raise PlotError(
            f"{path}: no results for workload {wanted!r}; present: {', '.join(present)}"
        )
    return wanted


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def nice_step(span, target_ticks):
    """A step of 1, 2, 2.5 or 5 x 10^k giving about target_ticks intervals over span."""
    if span <= 0:
        return 1.0
    raw = span / target_ticks
    base = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * base >= raw:
            return m * base
    return 10 * base


def format_tick(v, step):
    """v with as many decimals as the step needs (0.25: 2, 0.5: 1, 5: 0)."""
    decimals = 0
    while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-9:
        decimals += 1
    return f"{v:,.{decimals}f}"


def text_width(text, size, mono=False):
    """About how wide text is: monospace 0.6 em a character, sans-serif about 0.52."""
    return len(text) * size * (0.6 if mono else 0.52)


def fit(text, size, width, mono=False):
    """text, cut with an ellipsis to about width pixels."""
    limit = int(width / (size * (0.6 if mono else 0.52)))
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "\u2026"


def wrap(text, size, width, lines, mono=False):
    """text in at most `lines` lines of about width pixels, broken at spaces; the last one cut."""
    limit = max(1, int(width / (size * (0.6 if mono else 0.52))))
    out = []
    rest = text
    while rest and len(out) < lines - 1 and len(rest) > limit:
        cut = rest.rfind(" ", 0, limit + 1)
        if cut <= 0:
            cut = limit
        out.append(rest[:cut])
        rest = rest[cut:].lstrip(" ")
    if rest:
        out.append(fit(rest, size, width, mono))
    return out


def marker(shape, x, y, colour, r=4.2):
    if shape == "square":
        return (
            f"<rect x='{x - r:.1f}' y='{y - r:.1f}' width='{2 * r:.1f}' height='{2 * r:.1f}' "
            f"fill='{colour}' stroke='white' stroke-width='1'/>"
        )
    if shape == "triangle":
        h = r * 1.15
        return (
            f"<polygon points='{x:.1f},{y - h:.1f} {x + h:.1f},{y + h * 0.8:.1f} "
            f"{x - h:.1f},{y + h * 0.8:.1f}' fill='{colour}' stroke='white' stroke-width='1'/>"
        )
    return (
        f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{r:.1f}' fill='{colour}' stroke='white' "
        f"stroke-width='1'/>"
    )


def series_of(results, workload):
    """{loader: {"points": [(workers, value)], "runs": [(workers, v)], "errors": [workers]}}."""
    series = {}
    for r in results:
        if r["workload"] != workload:
            continue
        s = series.setdefault(r["loader"], {"points": [], "runs": [], "errors": []})
        w = r["workers"]
        if not is_number(w):
            continue
        if is_number(r.get("value")):
            s["points"].append((w, float(r["value"])))
        else:
            s["errors"].append(w)
        for v in r.get("runs") or []:
            if is_number(v):
                s["runs"].append((w, float(v)))
    for s in series.values():
        s["points"].sort()
    order = [k for k in LOADERS if k in series] + sorted(k for k in series if k not in LOADERS)
    return {k: series[k] for k in order}


def render(doc, workload):
    results = doc["results"]
    units = {r.get("unit") for r in results if r["workload"] == workload and r.get("unit")}
    if len(units) > 1:
        raise PlotError(f"workload {workload!r} has results in several units: {sorted(units)}")
    unit = units.pop() if units else ""
    series = series_of(results, workload)

    workers = sorted({w for s in series.values() for w, _ in s["points"] + s["runs"]}
                     | {w for s in series.values() for w in s["errors"]})
    values = [v for s in series.values() for _, v in s["points"] + s["runs"]]
    if not workers:
        raise PlotError(f"workload {workload!r}: no worker counts with a result")

    # x: linear in num_workers, a little room on either side.
    x_lo, x_hi = min(workers), max(workers)
    if x_lo == x_hi:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    pad = (x_hi - x_lo) * 0.04
    x_lo, x_hi = x_lo - pad, x_hi + pad

    def sx(w):
        return LEFT + (w - x_lo) / (x_hi - x_lo) * (RIGHT - LEFT)

    # y: from 0 to a round value above the largest.
    top = max(values) if values else 1.0
    if top <= 0:
        top = 1.0
    y_step = nice_step(top * 1.05, 5)
    y_hi = math.ceil(top * 1.05 / y_step) * y_step

    def sy(v):
        return BOTTOM - v / y_hi * (BOTTOM - TOP)

    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
        f"viewBox='0 0 {WIDTH} {HEIGHT}'>",
        f"<rect width='{WIDTH}' height='{HEIGHT}' fill='white'/>",
    ]
    title = f"Loader throughput against num_workers: workload \u201c{workload}\u201d"
    out.append(
        f"<text x='{LEFT}' y='26' {FONT} font-size='15' font-weight='bold' fill='#222'>"
        f"{escape(fit(title, 15, WIDTH - LEFT - 10))}</text>"
    )

    # Grid and y ticks.
    n_y = int(round(y_hi / y_step))
    for i in range(n_y + 1):
        v = i * y_step
        y = sy(v)
        out.append(
            f"<line x1='{LEFT}' y1='{y:.1f}' x2='{RIGHT}' y2='{y:.1f}' "
            f"stroke='{'#999' if i == 0 else '#e3e3e3'}' stroke-width='1'/>"
        )
        out.append(
            f"<text x='{LEFT - 7}' y='{y + 4:.1f}' {FONT} font-size='11' fill='#444' "
            f"text-anchor='end'>{escape(format_tick(v, y_step))}</text>"
        )
    # x ticks at the measured worker counts (labels that would collide are left out).
    last_label = -1e9
    for w in workers:
        x = sx(w)
        out.append(
            f"<line x1='{x:.1f}' y1='{TOP}' x2='{x:.1f}' y2='{BOTTOM}' stroke='#eeeeee' "
            f"stroke-width='1'/>"
        )
        out.append(
            f"<line x1='{x:.1f}' y1='{BOTTOM}' x2='{x:.1f}' y2='{BOTTOM + 4}' stroke='#999'/>"
        )
        label = f"{w:g}"
        if x - last_label >= text_width(label, 11) + 6:
            out.append(
                f"<text x='{x:.1f}' y='{BOTTOM + 17}' {FONT} font-size='11' fill='#444' "
                f"text-anchor='middle'>{escape(label)}</text>"
            )
            last_label = x
    out.append(
        f"<line x1='{LEFT}' y1='{TOP}' x2='{LEFT}' y2='{BOTTOM}' stroke='#999' stroke-width='1'/>"
    )

    # Axis labels.
    out.append(
        f"<text x='{(LEFT + RIGHT) / 2:.1f}' y='{BOTTOM + 36}' {FONT} font-size='12' fill='#222' "
        f"text-anchor='middle'>num_workers (worker processes; LibTorch: threads)</text>"
    )
    y_label = f"throughput ({unit})" if unit else "throughput"
    yc = (TOP + BOTTOM) / 2
    out.append(
        f"<text x='18' y='{yc:.1f}' {FONT} font-size='12' fill='#222' text-anchor='middle' "
        f"transform='rotate(-90 18 {yc:.1f})'>{escape(y_label)}, higher is better</text>"
    )

    # The lines, runs and markers.
    colours = {}
    extra = iter(OTHER_COLOURS * 4)
    for loader in series:
        colours[loader] = LOADERS[loader][1] if loader in LOADERS else next(extra)
    repeated = any(len(s["runs"]) > len(s["points"]) for s in series.values())
    for loader, s in series.items():
        colour = colours[loader]
        shape = LOADERS.get(loader, (None, None, "circle"))[2]
        if repeated:
            for w, v in s["runs"]:
                out.append(
                    f"<circle cx='{sx(w):.1f}' cy='{sy(v):.1f}' r='2.2' fill='{colour}' "
                    f"fill-opacity='0.35'/>"
                )
        if len(s["points"]) > 1:
            pts = " ".join(f"{sx(w):.1f},{sy(v):.1f}" for w, v in s["points"])
            out.append(
                f"<polyline points='{pts}' fill='none' stroke='{colour}' stroke-width='2.2' "
                f"stroke-linejoin='round'/>"
            )
        for w, v in s["points"]:
            unit_text = f" {unit}" if unit else ""
            out.append(
                f"<g>{marker(shape, sx(w), sy(v), colour)}<title>"
                f"{escape(f'{loader}, {w:g} workers: {v:,.1f}{unit_text}')}</title></g>"
            )
        for w in s["errors"]:  # failed: a cross on the axis
            x, y = sx(w), BOTTOM
            out.append(
                f"<path d='M{x - 4:.1f},{y - 4:.1f} L{x + 4:.1f},{y + 4:.1f} M{x - 4:.1f},"
                f"{y + 4:.1f} L{x + 4:.1f},{y - 4:.1f}' stroke='{colour}' stroke-width='2'/>"
            )

    # Legend, to the right of the plot.
    lx, ly = RIGHT + 22, TOP + 8
    for loader, s in series.items():
        label = LOADERS[loader][0] if loader in LOADERS else loader
        shape = LOADERS.get(loader, (None, None, "circle"))[2]
        colour = colours[loader]
        out.append(
            f"<line x1='{lx}' y1='{ly}' x2='{lx + 26}' y2='{ly}' stroke='{colour}' "
            f"stroke-width='2.2'/>"
        )
        out.append(marker(shape, lx + 13, ly, colour))
        out.append(
            f"<text x='{lx + 34}' y='{ly + 4}' {FONT} font-size='12' fill='#222'>"
            f"{escape(fit(label, 12, WIDTH - lx - 40))}</text>"
        )
        if s["errors"]:
            failed = ", ".join(f"{w:g}" for w in sorted(s["errors"]))
            ly += 15
            out.append(
                f"<text x='{lx + 34}' y='{ly + 4}' {FONT} font-size='10' fill='#b00'>"
                f"{escape(fit('failed at ' + failed, 10, WIDTH - lx - 40))}</text>"
            )
        ly += 22
    if repeated:
        out.append(
            f"<circle cx='{lx + 13}' cy='{ly}' r='2.2' fill='#555' fill-opacity='0.5'/>"
            f"<text x='{lx + 34}' y='{ly + 4}' {FONT} font-size='11' fill='#555'>each run</text>"
        )
        ly += 18
        out.append(
            f"<text x='{lx + 34}' y='{ly + 4}' {FONT} font-size='11' fill='#555'>"
            f"line: median of {doc.get('repeat', '?')}</text>"
        )

    # Caption: the machine, then the command.
    m = doc.get("machine") or {}
    parts = []
    if is_number(m.get("cpus")):
        parts.append(f"{m['cpus']} hardware threads")
    if m.get("model"):
        parts.append(str(m["model"]))
    versions = []
    if m.get("ferry"):
        versions.append(f"ferry {m['ferry']}")
    if m.get("torch"):
        versions.append(f"PyTorch {m['torch']}")
    if m.get("libtorch"):
        versions.append(f"LibTorch {m['libtorch']}")
    budget = doc.get("budget") or {}
    if is_number(budget.get("seconds")):
        versions.append(f"{budget['seconds']:g} s per run")
    elif is_number(budget.get("batches")):
        versions.append(f"{budget['batches']:g} batches per run")
    machine = "Machine: " + (", ".join(parts) if parts else "unknown")
    if versions:
        machine += "; " + ", ".join(versions)
    out.append(
        f"<text x='12' y='{HEIGHT - 42}' {FONT} font-size='11' fill='#444'>"
        f"{escape(fit(machine, 11, WIDTH - 24))}<title>{escape(machine)}</title></text>"
    )
    command = "$ " + str(doc.get("command", ""))
    command_lines = wrap(command, 10.5, WIDTH - 24, 2, mono=True)
    for i, line in enumerate(command_lines):
        y = HEIGHT - 12 - 13 * (len(command_lines) - 1 - i)
        out.append(
            f"<text x='12' y='{y}' {MONO} font-size='10.5' fill='#444' xml:space='preserve'>"
            f"{escape(('  ' if i else '') + line)}<title>{escape(command)}</title></text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Draw ferry_loader_bench --json results as an SVG chart of throughput "
        "against num_workers."
    )
    parser.add_argument("file", metavar="FILE.json", help="written by ferry_loader_bench --json")
    parser.add_argument("-o", "--output", metavar="OUT.svg",
                        help="where to write the SVG (default: FILE with .svg; -: stdout)")
    parser.add_argument("--workload", metavar="NAME",
                        help="the workload to draw (default: tensor if present, else the first)")
    args = parser.parse_args(argv)
    try:
        doc = load(args.file)
        workload = choose_workload(args.file, doc["results"], args.workload)
        svg = render(doc, workload)
    except PlotError as e:
        print(f"plot_workers.py: {e}", file=sys.stderr)
        return 1
    output = args.output or os.path.splitext(args.file)[0] + ".svg"
    if output != "-" and os.path.abspath(output) == os.path.abspath(args.file):
        print(f"plot_workers.py: {output}: the output would replace the input; give -o",
              file=sys.stderr)
        return 1
    if output == "-":
        sys.stdout.write(svg)
        return 0
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(svg)
    except OSError as e:
        print(f"plot_workers.py: {output}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"wrote {output} (workload {workload})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
