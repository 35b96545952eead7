#!/usr/bin/env python3
"""Plots a microstore status time series (JSON lines from bench-microstores.sh) as an SVG with five panels:
each microstore's p99 latency per round (as the server measured it), the object bytes it moved and its
bandwidth cap (dashed), the request workers it holds, the erasure sets it holds (the default
microstore's: the home), and its points of drive IO (the default one's left out: it holds the rest of
10,000), over time; shaded where some bucket's data moved between sets.

    scripts/plot-microstores.py STATUS.jsonl OUT.svg
"""
import json
import sys

COLORS = {"small": "#1f77b4", "large": "#d62728", "default": "#7f7f7f"}
W, PAD_L, PAD_R, PAD_T, PANEL_H, GAP = 760, 70, 120, 30, 150, 50
PANELS = 5
H = PAD_T + PANELS * PANEL_H + (PANELS - 1) * GAP + 40
DASHED = "6 4"


def load(path):
    points = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                points.append(json.loads(line))
    return points


def series(points, key):
    out = {}
    for p in points:
        for m in p["microstores"]:
            v = key(m)
            if v is not None:
                out.setdefault(m["name"], []).append((p["t"], v))
    return out


def spans(points):
    """The time spans in which some bucket's data (or the home) moved between sets."""
    out, start = [], None
    for p in points:
        if p.get("moving") and start is None:
            start = p["t"]
        elif not p.get("moving") and start is not None:
            out.append((start, p["t"]))
            start = None
    if start is not None:
        out.append((start, points[-1]["t"]))
    return out


def panel(svg, top, title, unit, data, t_max, dashed=None, moving=()):
    dashed = dashed or {}
    v_max = max([v for s in list(data.values()) + list(dashed.values()) for _, v in s] + [1.0]) * 1.1
    x = lambda t: PAD_L + (W - PAD_L - PAD_R) * t / t_max
    y = lambda v: top + PANEL_H - PANEL_H * v / v_max
    svg.append(f'<text x="{PAD_L}" y="{top - 8}" font-size="13">{title}</text>')
    for t0, t1 in moving:
        svg.append(f'<rect x="{x(t0):.1f}" y="{top}" width="{max(x(t1) - x(t0), 1.0):.1f}" height="{PANEL_H}" fill="#fdf2d0"/>')
    svg.append(f'<rect x="{PAD_L}" y="{top}" width="{W - PAD_L - PAD_R}" height="{PANEL_H}" fill="none" stroke="#999"/>')
    for i in range(5):
        v = v_max * i / 4
        label = f"{v:.1f}" if v_max < 10 else f"{v:.0f}"
        svg.append(f'<text x="{PAD_L - 6}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end">{label}</text>')
    svg.append(f'<text x="14" y="{top + PANEL_H / 2}" font-size="11" transform="rotate(-90 14 {top + PANEL_H / 2})">{unit}</text>')
    for name, pts in sorted(data.items()):
        color = COLORS.get(name, "#2ca02c")
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.6"/>')
    for name, pts in sorted(dashed.items()):
        color = COLORS.get(name, "#2ca02c")
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        svg.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.2" stroke-dasharray="{DASHED}"/>')
    for i, name in enumerate(sorted(data)):
        color = COLORS.get(name, "#2ca02c")
        svg.append(f'<text x="{W - PAD_R + 10}" y="{top + 16 + 16 * i}" font-size="12" fill="{color}">{name}</text>')


def main():
    points = load(sys.argv[1])
    if not points:
        sys.exit("no status samples")
    t_max = max(p["t"] for p in points) or 1.0
    # Latency is plotted for the microstores held to a latency target (a large one's p99 of seconds would
    # flatten theirs), with the target dashed; samples without targets plot every microstore.
    latency_bound = lambda m: "target" not in m or "latency_ms_p99" in (m["target"] or {})
    p99 = series(points, lambda m: (m.get("last_round") or {}).get("latency_ms_p99") if latency_bound(m) else None)
    p99_targets = series(points, lambda m: (m.get("target") or {}).get("latency_ms_p99"))
    moved = series(points, lambda m: (m.get("last_round") or {}).get("throughput_mib_s"))
    caps = series(points, lambda m: m.get("bandwidth_cap_mib_s"))
    workers = series(points, lambda m: m.get("workers"))
    sets = series(points, lambda m: len(m["sets"]) if m.get("sets") is not None else None)
    io_points = series(points, lambda m: m.get("io_points") if m["name"] != "default" else None)
    moving = spans(points)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    top = lambda i: PAD_T + i * (PANEL_H + GAP)
    title = "p99 latency per round (server side; dashed: target); shaded: data moving between sets"
    panel(svg, top(0), title, "ms", p99, t_max, p99_targets, moving)
    panel(svg, top(1), "object bytes moved per round; dashed: bandwidth cap", "MiB/s", moved, t_max, caps, moving)
    panel(svg, top(2), "request workers held", "workers", workers, t_max, moving=moving)
    panel(svg, top(3), "erasure sets held (default: the home)", "sets", sets, t_max, moving=moving)
    panel(svg, top(4), "points of drive IO held (the default one holds the rest of 10,000)", "points", io_points, t_max,
          moving=moving)
    base = top(4) + PANEL_H
    for i in range(6):
        t = t_max * i / 5
        xx = PAD_L + (W - PAD_L - PAD_R) * t / t_max
        svg.append(f'<text x="{xx:.1f}" y="{base + 16}" font-size="10" text-anchor="middle">{t:.0f} s</text>')
    svg.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
