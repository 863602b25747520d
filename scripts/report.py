#!/usr/bin/env python3
"""The curves of one or more training runs (`mirrored report RUN [RUN...] --out DIR` runs this):
from each run folder's metrics.jsonl (read as it is, so a run still training can be reported)
and summary.json (when the run has ended), writes into DIR:
  loss.png, accuracy.png   train and test loss / accuracy against steps
  loss_time.png            train loss against wall time, resumes and alerts marked
  lr.png, throughput.png   learning rate and samples/s against steps
  time_split.png           where the step time went (data wait / compute / exposed communication)
  report.html              one self-contained page: the figures embedded and a summary table
  report.json              what was plotted: per run, the records read and the points of each curve
Several runs are overlaid, each named in the legend by its folder. Standard library and matplotlib.

    python3 scripts/report.py --out DIR RUN [RUN...]

Exit status: 0 written; 2 bad arguments or a run folder without metrics.jsonl; 3 matplotlib is
missing (Debian/Ubuntu: python3-matplotlib, which scripts/install_deps.sh installs)."""
import argparse
import base64
import html
import json
import os
import sys


def read_run(folder):
    """The records of metrics.jsonl by type (a line cut short by a crash, or not JSON, is skipped)
    and summary.json (None while the run is training or after a crash)."""
    records = {"train": [], "eval": [], "alert": [], "resume": []}
    skipped = 0
    with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                skipped += 1
                continue
            if isinstance(r, dict) and r.get("type") in records:
                records[r["type"]].append(r)
    summary = None
    try:
        with open(os.path.join(folder, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        pass
    name = os.path.basename(os.path.normpath(folder))
    return {"folder": folder, "name": name, "records": records, "summary": summary, "skipped_lines": skipped}


def span_s(run):
    """Seconds from the run's first record to its last (0 without time stamps)."""
    times = [r.get("time") for rs in run["records"].values() for r in rs if r.get("time") is not None]
    return (max(times) - min(times)) if times else 0.0


def time_unit(runs):
    """The wall-time axis' unit for the longest run: (name, seconds per unit)."""
    longest = max((span_s(r) for r in runs), default=0.0)
    if longest < 120:
        return "s", 1.0
    if longest < 3 * 3600:
        return "min", 60.0
    return "h", 3600.0


def elapsed(run, records, unit_s):
    """Wall time of each record since the run's first record, in the axis' unit."""
    times = [r.get("time") for rs in run["records"].values() for r in rs if r.get("time") is not None]
    t0 = min(times) if times else 0.0
    return [(r["time"] - t0) / unit_s if r.get("time") is not None else None for r in records]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    for folder in a.runs:
        if not os.path.isfile(os.path.join(folder, "metrics.jsonl")):
            print(f"report: {folder}: no metrics.jsonl (expected a run folder, e.g. runs/NAME)", file=sys.stderr)
            return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 3
    runs = [read_run(f) for f in a.runs]
    names = [r["name"] for r in runs]
    if len(set(names)) != len(names):  # the same folder name under two parents: say which
        for r in runs:
            r["name"] = os.path.normpath(r["folder"])
    os.makedirs(a.out, exist_ok=True)
    plotted = {r["name"]: {} for r in runs}
    unit, unit_s = time_unit(runs)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def figure(filename, title, xlabel, ylabel, draw):
        fig, ax = plt.subplots(figsize=(7.2, 4.2), dpi=110)
        for i, run in enumerate(runs):
            draw(ax, run, colors[i % len(colors)])
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, filename))
        plt.close(fig)

    def line(ax, run, key, xs, ys, color, label, style="-", marker=None):
        pts = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, marker=marker, markersize=3,
                    label=label)
        plotted[run["name"]][key] = len(pts)

    def steps(records, key):
        return [r.get("step") for r in records], [r.get(key) for r in records]

    def loss(ax, run, c):
        line(ax, run, "train_loss", *steps(run["records"]["train"], "loss"), c, f"{run['name']} train")
        line(ax, run, "test_loss", *steps(run["records"]["eval"], "test_loss"), c, f"{run['name']} test", "--", "o")

    def accuracy(ax, run, c):
        line(ax, run, "train_accuracy", *steps(run["records"]["train"], "accuracy"), c, f"{run['name']} train")
        line(ax, run, "test_accuracy", *steps(run["records"]["eval"], "test_accuracy"), c, f"{run['name']} test",
             "--", "o")

    def loss_time(ax, run, c):
        tr = run["records"]["train"]
        line(ax, run, "train_loss_time", elapsed(run, tr, unit_s), [r.get("loss") for r in tr], c, run["name"])
        for i, (m, r) in enumerate(zip(elapsed(run, run["records"]["resume"], unit_s), run["records"]["resume"])):
            if m is not None:
                ax.axvline(m, color=c, linestyle=":", label=f"{run['name']} resumed" if i == 0 else None)
                ax.annotate(f"resumed at step {r.get('step')}\n({r.get('redone_steps', 0)} steps redone)", (m, 0.98),
                            xycoords=("data", "axes fraction"), fontsize=7, va="top", rotation=90, color=c)
        alerts = run["records"]["alert"]
        am = elapsed(run, alerts, unit_s)
        ys = [min((r.get("loss") for r in tr), default=0.0)] * len(alerts)
        line(ax, run, "alerts", am, ys, c, f"{run['name']} alerts" if alerts else None, "", "x")
        plotted[run["name"]]["resumes"] = len([m for m in elapsed(run, run["records"]["resume"], unit_s) if m is not None])

    def lr(ax, run, c):
        line(ax, run, "lr", *steps(run["records"]["train"], "lr"), c, run["name"])

    def throughput(ax, run, c):
        line(ax, run, "samples_per_sec", *steps(run["records"]["train"], "samples_per_sec"), c, run["name"])

    def split(ax, run, c):
        tr = run["records"]["train"]
        for part, style in (("data_wait", ":"), ("compute", "-"), ("comm", "--")):
            line(ax, run, f"split_{part}", [r.get("step") for r in tr],
                 [(r.get("time_split") or {}).get(part) for r in tr], c, f"{run['name']} {part.replace('_', ' ')}",
                 style)

    figure("loss.png", "Loss", "step", "loss", loss)
    figure("accuracy.png", "Accuracy", "step", "accuracy (fraction correct)", accuracy)
    figure("loss_time.png", "Train loss against wall time (resumes and alerts marked)",
           f"wall time since the first record ({unit})", "train loss", loss_time)
    figure("lr.png", "Learning rate", "step", "learning rate", lr)
    figure("throughput.png", "Throughput", "step", "samples/s", throughput)
    figure("time_split.png", "Where the step time went", "step", "fraction of step time", split)

    rows = []
    for run in runs:
        s = run["summary"] or {}
        tr, ev = run["records"]["train"], run["records"]["eval"]
        rows.append({
            "run": run["name"],
            "status": s.get("status", "training or interrupted"),
            "steps": s.get("steps", tr[-1]["step"] if tr else None),
            "train loss": s.get("train_loss", tr[-1].get("loss") if tr else None),
            "test loss": s.get("test_loss", ev[-1].get("test_loss") if ev else None),
            "test accuracy": s.get("test_accuracy", ev[-1].get("test_accuracy") if ev else None),
            "wall time (s)": s.get("wall_time_s"),
            "samples/s": s.get("samples_per_sec", tr[-1].get("samples_per_sec") if tr else None),
            "replicas": s.get("replicas"),
            "devices": s.get("devices"),
            "device hours": (s.get("device_hours") or {}).get("total"),
            "of which data wait": (s.get("device_hours") or {}).get("data_wait"),
            "of which comm wait": (s.get("device_hours") or {}).get("comm_wait"),
            "of which redone": (s.get("device_hours") or {}).get("redone"),
            "resumes": len(run["records"]["resume"]),
            "steps redone": sum(r.get("redone_steps", 0) for r in run["records"]["resume"]),
            "alerts": len(run["records"]["alert"]),
            "mirrored": (s.get("software") or {}).get("mirrored"),
        })
    with open(os.path.join(a.out, "report.json"), "w", encoding="utf-8") as f:
        json.dump({"runs": [{"name": r["name"], "folder": r["folder"],
                             "records": {k: len(v) for k, v in r["records"].items()},
                             "skipped_lines": r["skipped_lines"], "plotted": plotted[r["name"]]} for r in runs],
                   "table": rows}, f, indent=1)

    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}"
        return html.escape(str(v))

    figures = ["loss.png", "accuracy.png", "loss_time.png", "lr.png", "throughput.png", "time_split.png"]
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>mirrored report</title>",
             "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:49%}</style></head><body>",
             f"<h1>mirrored report: {html.escape(', '.join(r['name'] for r in runs))}</h1><table><tr>"]
    parts += [f"<th>{html.escape(k)}</th>" for k in rows[0]]
    parts.append("</tr>")
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row.values()) + "</tr>")
    parts.append("</table>")
    for fig in figures:
        with open(os.path.join(a.out, fig), "rb") as f:
            data = base64.b64encode(f.read()).decode("ascii")
        parts.append(f"<img alt='{fig}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    with open(os.path.join(a.out, "report.html"), "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
    print(f"wrote {os.path.join(a.out, 'report.html')} and {len(figures)} figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
