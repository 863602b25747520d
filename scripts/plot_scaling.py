#!/usr/bin/env python3
"""Plots `mirrored scale`'s scaling.json: measured speedup per replica count against the ideal
line and the planner's prediction, each point labelled with its efficiency.

    python3 scripts/plot_scaling.py runs/NAME/scaling/scaling.json scaling.png

Exit status 3 when matplotlib is missing (Debian/Ubuntu: python3-matplotlib, which
scripts/install_deps.sh installs)."""
import json
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 3
    with open(sys.argv[1]) as f:
        run = json.load(f)
    rows = run["results"]
    n = [r["replicas"] for r in rows]
    speedup = [r["speedup"] for r in rows]
    base = n[0]
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    ax.plot(n, [k / base for k in n], "--", color="gray", label="ideal")
    ax.plot(n, speedup, "o-", color="tab:blue", label="measured")
    for k, s, r in zip(n, speedup, rows):
        ax.annotate(f"{100 * r['efficiency']:.0f}%", (k, s), textcoords="offset points", xytext=(6, -12), fontsize=9)
    predicted = [(r["replicas"], r["predicted"]["speedup"]) for r in rows if "predicted" in r]
    if predicted:
        ax.plot([p[0] for p in predicted], [p[1] for p in predicted], "s:", color="tab:orange", label="planner's prediction")
    ax.set_xlabel("replicas")
    ax.set_ylabel(f"speedup over {base} replica(s)")
    ax.set_xticks(n)
    ax.set_title(f"{run['mode']} scaling on {run['kind']} replicas: {run['config']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
