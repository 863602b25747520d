#!/usr/bin/env python3
"""The curves of one or more training runs (`mirrored report RUN [RUN...] --out DIR` runs this):
from each run folder's metrics.jsonl (read as it is, so a run still training can be reported)
and summary.json (when the run has ended), writes into DIR:
  loss.png, accuracy.png   train and test loss / accuracy against steps
  loss_time.png            train loss against wall time, resumes and alerts marked
  lr.png, throughput.png   learning rate and samples/s (tokens/s) against steps
  time_split.png           where the step time went (data wait / compute / exposed communication)
  report.html              one self-contained page: the figures embedded and a summary table
  report.json              what was plotted: per run, the records read and the points of each curve
Several runs are overlaid, each named in the legend by its folder. Standard library and matplotlib.

    python3 scripts/report.py --out DIR RUN [RUN...]

Exit status: 0 written; 2 bad arguments or a run folder without metrics.jsonl; 3 matplotlib is
missing (Debian/Ubuntu: python3-matplotlib, which scripts/install_deps.sh installs); 4 DIR could not
be written (the reason is printed; what was written is left for a rerun to replace)."""
import argparse
import base64
import html
import json
import math
import os
import sys
from array import array

# The numbers each record type keeps: metrics.jsonl is read a line at a time into one array of
# doubles per field (8 bytes a number, NaN where absent or not a number), so that a log of
# millions of records is reported in a fraction of the memory its parsed records would take.
FIELDS = {
    "train": ("step", "time", "loss", "accuracy", "lr", "samples_per_sec", "tokens_per_sec", "data_wait", "compute",
              "comm"),
    "eval": ("step", "time", "test_loss", "test_accuracy", "test_bits_per_byte"),
    "alert": ("step", "time"),
    "resume": ("step", "time", "redone_steps"),
    "continued": ("step", "time", "after_fault_s"),  # a run going on without a failed device
}
SPLIT = ("data_wait", "compute", "comm")  # inside a train record's time_split


def number(v):
    """A finite number of the record as a float, else NaN (a string, a list, a bool: not numbers)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = float(v)
        return v if math.isfinite(v) else math.nan
    return math.nan


class Columns:
    """One record type's fields as arrays; column(name) gives a list with None where absent."""

    def __init__(self, fields):
        self.fields = fields
        self.data = {f: array("d") for f in fields}

    def add(self, record):
        split = record.get("time_split")
        split = split if isinstance(split, dict) else {}
        for f in self.fields:
            self.data[f].append(number(split.get(f) if f in SPLIT else record.get(f)))

    def __len__(self):
        return len(self.data[self.fields[0]])

    def column(self, name):
        return [None if math.isnan(v) else v for v in self.data[name]]

    def last(self, name):
        """The field of the last record, None when there is none or it is absent."""
        if not len(self):
            return None
        v = self.data[name][-1]
        return None if math.isnan(v) else v


def read_run(folder):
    """The records of metrics.jsonl by type (a line cut short by a crash, not JSON, or not an
    object is skipped; a field of the wrong JSON type is taken as absent) and summary.json (None
    while the run is training, after a crash, or when it is not a JSON object)."""
    records = {t: Columns(f) for t, f in FIELDS.items()}
    skipped = 0
    with open(os.path.join(folder, "metrics.jsonl"), encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, or nested past Python's recursion limit
                skipped += 1
                continue
            kind = r.get("type") if isinstance(r, dict) else None
            if isinstance(kind, str) and kind in records:
                records[kind].add(r)
            else:
                skipped += 1
    summary = None
    try:
        with open(os.path.join(folder, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError):
        pass
    if not isinstance(summary, dict):
        summary = None
    name = os.path.basename(os.path.normpath(folder))
    return {"folder": folder, "name": name, "records": records, "summary": summary, "skipped_lines": skipped}


def label(text):
    """Text for a legend: matplotlib reads $...$ as mathematics and hides a label starting with "_";
    a folder name is plain text, always shown."""
    if not text:
        return text
    text = text.replace("$", r"\$")
    return "\u200b" + text if text.startswith("_") else text


def time_range(run):
    """The first and last time stamp of the run's records, (None, None) without any."""
    first = last = None
    for rs in run["records"].values():
        for t in rs.data["time"]:
            if t == t:  # not NaN
                first = t if first is None or t < first else first
                last = t if last is None or t > last else last
    return first, last


def span_s(run):
    """Seconds from the run's first record to its last (0 without time stamps)."""
    first, last = time_range(run)
    return last - first if first is not None else 0.0


def time_unit(runs):
    """The wall-time axis' unit for the longest run: (name, seconds per unit)."""
    longest = max((span_s(r) for r in runs), default=0.0)
    if longest < 120:
        return "s", 1.0
    if longest < 3 * 3600:
        return "min", 60.0
    return "h", 3600.0


def elapsed(run, records, unit_s):
    """Wall time of each record since the run's first record, in the axis' unit (NaN: none)."""
    t0 = time_range(run)[0] or 0.0
    return array("d", ((t - t0) / unit_s for t in records.data["time"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+", help="run folders (after --, a name may start with a dash)")
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
    try:
        runs = [read_run(f) for f in a.runs]
    except OSError as e:
        print(f"report: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        return write_report(a.out, runs, plt)
    except OSError as e:  # unwritable, full: say so; report.json marks the folder as the report's
        print(f"report: cannot write {e.filename or a.out}: {e.strerror}", file=sys.stderr)
        return 4


def write_report(out, runs, plt):
    names = [r["name"] for r in runs]
    if len(set(names)) != len(names):  # the same folder name under two parents: say which
        for r in runs:
            r["name"] = os.path.normpath(r["folder"])
    os.makedirs(out, exist_ok=True)
    # first, so that a folder left half-written (a full disk, a kill) is still known as the
    # report's, and a rerun writes over it
    write_whole(os.path.join(out, "report.json"), json.dumps({"status": "writing"}))
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
        fig.savefig(os.path.join(out, filename))
        plt.close(fig)

    def line(ax, run, key, xs, ys, color, text, style="-", marker=None):
        px, py = array("d"), array("d")  # the points where both are numbers, 16 bytes each
        for x, y in zip(xs, ys):
            if x is not None and y is not None and x == x and y == y:
                px.append(x)
                py.append(y)
        if px:
            ax.plot(px, py, style, color=color, marker=marker, markersize=3, label=label(text))
        plotted[run["name"]][key] = len(px)

    def steps(records, key):
        return records.data["step"], records.data[key]

    def loss(ax, run, c):
        line(ax, run, "train_loss", *steps(run["records"]["train"], "loss"), c, f"{run['name']} train")
        line(ax, run, "test_loss", *steps(run["records"]["eval"], "test_loss"), c, f"{run['name']} test", "--", "o")

    def accuracy(ax, run, c):
        line(ax, run, "train_accuracy", *steps(run["records"]["train"], "accuracy"), c, f"{run['name']} train")
        line(ax, run, "test_accuracy", *steps(run["records"]["eval"], "test_accuracy"), c, f"{run['name']} test",
             "--", "o")

    def loss_time(ax, run, c):
        tr, resumes = run["records"]["train"], run["records"]["resume"]
        line(ax, run, "train_loss_time", elapsed(run, tr, unit_s), tr.data["loss"], c, run["name"])
        marks = elapsed(run, resumes, unit_s)
        for i, (m, step, redone) in enumerate(zip(marks, resumes.column("step"), resumes.column("redone_steps"))):
            if m == m:
                ax.axvline(m, color=c, linestyle=":", label=label(f"{run['name']} resumed") if i == 0 else None)
                ax.annotate(f"resumed at step {'?' if step is None else int(step)}\n"
                            f"({int(redone or 0)} steps redone)", (m, 0.98),
                            xycoords=("data", "axes fraction"), fontsize=7, va="top", rotation=90, color=c)
        alerts = run["records"]["alert"]
        ys = [min((v for v in tr.data["loss"] if v == v), default=0.0)] * len(alerts)
        line(ax, run, "alerts", elapsed(run, alerts, unit_s), ys, c, f"{run['name']} alerts" if len(alerts) else None,
             "", "x")
        plotted[run["name"]]["resumes"] = sum(1 for m in marks if m == m)

    def lr(ax, run, c):
        line(ax, run, "lr", *steps(run["records"]["train"], "lr"), c, run["name"])

    def throughput(ax, run, c):  # a language model's in tokens/s
        tr = run["records"]["train"]
        key = "tokens_per_sec" if tr.last("tokens_per_sec") is not None else "samples_per_sec"
        line(ax, run, key, *steps(tr, key), c, run["name"] + (" (tokens/s)" if key == "tokens_per_sec" else ""))

    def split(ax, run, c):
        tr = run["records"]["train"]
        for part, style in (("data_wait", ":"), ("compute", "-"), ("comm", "--")):
            line(ax, run, f"split_{part}", *steps(tr, part), c, f"{run['name']} {part.replace('_', ' ')}", style)

    figure("loss.png", "Loss", "step", "loss", loss)
    figure("accuracy.png", "Accuracy", "step", "accuracy (fraction correct)", accuracy)
    figure("loss_time.png", "Train loss against wall time (resumes and alerts marked)",
           f"wall time since the first record ({unit})", "train loss", loss_time)
    figure("lr.png", "Learning rate", "step", "learning rate", lr)
    figure("throughput.png", "Throughput", "step", "samples/s (language models: tokens/s)", throughput)
    figure("time_split.png", "Where the step time went", "step", "fraction of step time", split)

    rows = []
    for run in runs:
        s = run["summary"] or {}
        tr, ev = run["records"]["train"], run["records"]["eval"]
        hours = s.get("device_hours") if isinstance(s.get("device_hours"), dict) else {}
        software = s.get("software") if isinstance(s.get("software"), dict) else {}
        last_step = tr.last("step")
        rows.append({
            "run": run["name"],
            "status": s.get("status", "training or interrupted"),
            "steps": s.get("steps", None if last_step is None else int(last_step)),
            "train loss": s.get("train_loss", tr.last("loss")),
            "test loss": s.get("test_loss", ev.last("test_loss")),
            "test accuracy": s.get("test_accuracy", ev.last("test_accuracy")),
            "wall time (s)": s.get("wall_time_s"),
            "test bits/byte": s.get("test_bits_per_byte", ev.last("test_bits_per_byte")),
            "samples/s": s.get("samples_per_sec", tr.last("samples_per_sec")),
            "tokens/s": s.get("tokens_per_sec", tr.last("tokens_per_sec")),
            "replicas": s.get("replicas"),
            "devices": s.get("devices"),
            "device hours": hours.get("total"),
            "of which data wait": hours.get("data_wait"),
            "of which comm wait": hours.get("comm_wait"),
            "of which redone": hours.get("redone"),
            "resumes": len(run["records"]["resume"]),
            "steps redone": int(sum(v for v in run["records"]["resume"].column("redone_steps") if v is not None)),
            "alerts": len(run["records"]["alert"]),
            "replica failures": len(s["replica_failures"]) if isinstance(s.get("replica_failures"), list) else 0,
            "mirrored": software.get("mirrored"),
        })

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
        with open(os.path.join(out, fig), "rb") as f:
            data = base64.b64encode(f.read()).decode("ascii")
        parts.append(f"<img alt='{fig}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    write_whole(os.path.join(out, "report.html"), "\n".join(parts))
    # last: a report.json that names its runs says the report is whole
    write_whole(os.path.join(out, "report.json"), json.dumps(
        {"runs": [{"name": r["name"], "folder": r["folder"], "records": {k: len(v) for k, v in r["records"].items()},
                   "skipped_lines": r["skipped_lines"], "plotted": plotted[r["name"]]} for r in runs],
         "table": rows}, indent=1))
    print(f"wrote {os.path.join(out, 'report.html')} and {len(figures)} figures")
    return 0


def write_whole(path, text):
    """The file whole or not at all: written beside its name, then renamed over it."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


if __name__ == "__main__":
    sys.exit(main())
