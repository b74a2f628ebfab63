#!/usr/bin/env python3
"""Draws training-loss curves as one SVG line chart (standard library only).

  python3 scripts/loss_chart.py OUT.svg "title" name=FILE.loss [name=FILE.loss ...]

Each FILE.loss holds "step loss [...]" lines (scripts/zeropp_parity.sh writes them); each curve is
smoothed with a running mean over 5 logged steps so that the lines can be told apart.
"""
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf"]


def read(path):
    points = []
    for line in open(path):
        parts = line.split()
        if len(parts) >= 2:
            points.append((float(parts[0]), float(parts[1])))
    return points


def smooth(points, k=5):
    out = []
    for i in range(len(points)):
        window = points[max(0, i - k + 1):i + 1]
        out.append((points[i][0], sum(p[1] for p in window) / len(window)))
    return out


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, title, series = sys.argv[1], sys.argv[2], []
    for arg in sys.argv[3:]:
        name, path = arg.split("=", 1)
        series.append((name, smooth(read(path))))
    steps = [p[0] for _, s in series for p in s]
    losses = [p[1] for _, s in series for p in s if p[0] >= 0.1 * max(steps)]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(losses), max(losses)
    y1 += (y1 - y0) * 0.05
    W, H, L, R, T, B = 760, 420, 60, 230, 40, 40
    def sx(x):
        return L + (x - x0) / (x1 - x0) * (W - L - R)
    def sy(y):
        return T + (1 - (min(y, y1) - y0) / (y1 - y0)) * (H - T - B)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="20" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        svg.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
        svg.append(f'<line x1="{L}" y1="{sy(y):.1f}" x2="{W - R}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        x = x0 + (x1 - x0) * i / 4
        svg.append(f'<text x="{sx(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x:.0f}</text>')
    svg.append(f'<text x="{(L + W - R) / 2}" y="{H - 6}" text-anchor="middle">step</text>')
    for k, (name, points) in enumerate(series):
        color = COLORS[k % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points if x >= 0.1 * x1)
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.2" points="{path}"/>')
        svg.append(f'<line x1="{W - R + 10}" y1="{T + 18 * k}" x2="{W - R + 30}" y2="{T + 18 * k}" stroke="{color}" stroke-width="2"/>')
        svg.append(f'<text x="{W - R + 35}" y="{T + 18 * k + 4}">{name}</text>')
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
