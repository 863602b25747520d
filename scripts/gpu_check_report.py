#!/usr/bin/env python3
"""The report of scripts/gpu_check.sh: from its work folder (checks.tsv, bench/*.json, logs/)
writes OUT/gpu_check.json (every check and number) and OUT/summary.txt (one screen: the checks
by phase, what failed, what runs elsewhere, what the budget left out, each target figure beside
its goal). Each file is written whole under a temporary name, then renamed: a check killed while
it writes keeps the previous one. Standard library only.
    gpu_check_report.py --work DIR --out DIR --budget S --elapsed S [--dry-run 0|1] [--running PHASE]
--running: the check is still going (it writes the report as each phase ends); the summary's
first line says which phase had begun."""
import argparse
import glob
import json
import os

FAILING = {"fail", "timeout", "crash", "refused", "skipped"}
PHASES = ["build", "preflight", "cases", "targets", "resume", "rest"]
# cuBLAS through PyTorch on one H200 (../shared/reference): TFLOP/s at 4096^3
GEMM_REFERENCE = {"fp32": 51.0, "tf32": 412.0, "bf16": 786.0}


def read_checks(path):
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 6:
                continue
            phase, name, status, start, seconds, detail = parts
            rows.append({"phase": phase, "check": name, "status": status, "start_s": int(start),
                         "seconds": int(seconds), "detail": detail})
    return rows


def read_benchmarks(folder):
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                out[os.path.basename(path)[:-5]] = json.load(f)
        except (OSError, ValueError) as e:
            out[os.path.basename(path)[:-5]] = {"unreadable": str(e)}
    return out


def step_ms(bench, name, devices=None):
    rows = bench.get(name, {}).get("results", [])
    for r in rows:
        if devices is None or r.get("devices") == devices:
            return r.get("step_ms")
    return None


def gemm_tflops(bench, precision, size=4096):
    rows = bench.get("gemm_" + precision, {}).get("results", [])
    rates = [r["gflops"] for r in rows if r.get("m") == size and r.get("n") == size and "gflops" in r]
    return max(rates) / 1000.0 if rates else None


def targets(bench):
    """Each target: what, measured, goal, verdict (met / missed / not measured)."""
    out = []

    def add(what, value, goal_text, ok, unit):
        verdict = "not measured" if value is None else ("met" if ok(value) else "missed")
        out.append({"target": what, "measured": value, "unit": unit, "goal": goal_text, "verdict": verdict})

    add("MLP step at batch 256, fp32, captured (cuda:0)", step_ms(bench, "step_b256_fp32_graph_true"),
        "<= 0.100 ms", lambda v: v <= 0.100, "ms")
    one = step_ms(bench, "step_shared_4x512_graph_true", "cuda:0")
    four = step_ms(bench, "step_shared_4x512_graph_true", "cuda:0,0,0,0")
    add("4 replicas sharing GPU 0 at 512 / 1 at 2048 (direct, captured), step-time ratio",
        four / one if one and four else None, "<= 1.10", lambda v: v <= 1.10, "x")
    for p, ref in GEMM_REFERENCE.items():
        add(f"cuBLAS GEMM 4096^3 {p}, against PyTorch's {ref:g} TFLOP/s", gemm_tflops(bench, p),
            f">= {0.9 * ref:g} (0.9x)", lambda v, r=ref: v >= 0.9 * r, "TFLOP/s")
    return out


def first_line(path, prefix):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(prefix) or prefix.lower() in line.lower():
                    return line.strip()
    except OSError:
        pass
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=int, required=True)
    ap.add_argument("--elapsed", type=int, required=True)
    ap.add_argument("--dry-run", default="0")
    ap.add_argument("--running", help="the phase that had begun when this was written (a report so far)")
    a = ap.parse_args()

    checks = read_checks(os.path.join(a.work, "checks.tsv"))
    bench = read_benchmarks(os.path.join(a.work, "bench"))
    logs = os.path.join(a.work, "logs")
    machine = {"gpu": first_line(os.path.join(logs, "devices.txt"), "cuda:0 "),
               "runtime": first_line(os.path.join(logs, "devices.txt"), "CUDA runtime"),
               "cpu": first_line(os.path.join(logs, "devices.txt"), "CPU:")}
    tgt = targets(bench)
    failed = [c for c in checks if c["status"] in FAILING]
    count = lambda s: sum(1 for c in checks if c["status"] == s)
    report = {"budget_s": a.budget, "elapsed_s": a.elapsed, "dry_run": a.dry_run == "1", "running": a.running,
              "machine": machine,
              "passed": count("pass"), "failed": len(failed), "runs_elsewhere": count("elsewhere"),
              "not_run": count("not run") + count("cut"), "absent": count("absent"), "checks": checks, "targets": tgt, "benchmarks": bench}
    os.makedirs(a.out, exist_ok=True)
    write_whole(os.path.join(a.out, "gpu_check.json"), json.dumps(report, indent=1))

    lines = [f"gpu_check: SO FAR - still running, phase '{a.running}' had begun; the check did not end"] if a.running else []
    lines += [f"gpu_check: {report['passed']} passed, {len(failed)} failed, {report['runs_elsewhere']} run elsewhere, "
             f"{report['not_run']} not run (time) - {a.elapsed} s of {a.budget}"
             + (" (dry run: the GPU steps fail as they must)" if report["dry_run"] else "")]
    for k in ("gpu", "runtime", "cpu"):
        if machine[k]:
            lines.append("  " + machine[k])
    lines.append(f"{'phase':<10} {'pass':>5} {'fail':>5} {'elsewhere':>9} {'not run':>8} {'seconds':>8}")
    for ph in PHASES:
        rows = [c for c in checks if c["phase"] == ph]
        if not rows:
            continue
        n = lambda pred: sum(1 for c in rows if pred(c["status"]))
        lines.append(f"{ph:<10} {n(lambda s: s == 'pass'):>5} {n(lambda s: s in FAILING):>5} "
                     f"{n(lambda s: s == 'elsewhere'):>9} {n(lambda s: s in ('not run', 'cut')):>8} "
                     f"{sum(c['seconds'] for c in rows):>8}")
    if failed and not report["dry_run"]:
        lines.append("FAILED:")
        lines += [f"  [{c['phase']}] {c['status']}: {c['check']}" + (f" - {c['detail']}" if c["detail"] else "")
                  for c in failed[:12]]
        if len(failed) > 12:
            lines.append(f"  ... {len(failed) - 12} more in gpu_check.json")
    elsewhere = [c for c in checks if c["status"] == "elsewhere"]
    if elsewhere:
        lines.append("RUNS ELSEWHERE (declared by the case, not a failure):")
        lines += [f"  {c['check']} - {c['detail']}" for c in elsewhere]
    not_run = [c for c in checks if c["status"] in ("not run", "cut")]
    if not_run:
        lines.append(f"NOT RUN (the budget was spent): " + ", ".join(c["check"] for c in not_run[:8])
                     + (f" and {len(not_run) - 8} more" if len(not_run) > 8 else ""))
    absent = [c for c in checks if c["status"] == "absent"]
    if absent:
        lines.append("LEFT OUT (not a GPU matter): " + "; ".join(f"{c['check']} - {c['detail']}" for c in absent))
    lines.append(f"{'target':<78} {'measured':>10} {'goal':>14}  verdict")
    for t in tgt:
        v = "-" if t["measured"] is None else f"{t['measured']:.3f}"
        lines.append(f"{t['target']:<78} {v:>10} {t['goal']:>14}  {t['verdict']}")
    table = []
    for b in (256, 2048):
        cells = []
        for p in ("fp32", "tf32", "bf16"):
            u, c = step_ms(bench, f"step_b{b}_{p}_graph_false"), step_ms(bench, f"step_b{b}_{p}_graph_true")
            cells.append(f"{p} {'-' if u is None else f'{u:.3f}'}/{'-' if c is None else f'{c:.3f}'}")
        table.append(f"  batch {b:<5} " + "   ".join(cells))
    lines.append("MLP ms/step on cuda:0 (uncaptured/captured):")
    lines += table
    gpt = [step_ms(bench, f"step_gpt_fused_attention_{f}") for f in ("false", "true")]
    lines.append("GPT (GPU_CHECK_GPT_CONFIG, bf16) ms/step on cuda:0, attention unfused/fused: "
                 + "/".join("-" if v is None else f"{v:.3f}" for v in gpt))
    lines.append("files: summary.txt, gpu_check.json (every number), logs.tar.gz (every log), nvidia-smi.txt")
    write_whole(os.path.join(a.out, "summary.txt"), "\n".join(lines) + "\n")


def write_whole(path, text):
    with open(path + ".new", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".new", path)


if __name__ == "__main__":
    main()
