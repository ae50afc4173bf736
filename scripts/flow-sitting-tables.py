#!/usr/bin/env python3
"""Prints the tables of a flow sitting (scripts/flow-sitting.sh OUTDIR ROUNDS):
Wharf beside DBOS per workload and round with the ratio and the medians, the
step-to-step p99 at half the drained rate, the keyed workload against its
limit-bound ideal with 1, 2 and 4 runners, and the ratelimited workload."""
import json
import re
import statistics
import sys

out, rounds = sys.argv[1], int(sys.argv[2])


def wharf(name):
    try:
        with open(f"{out}/{name}.json") as f:
            return json.load(f)[0]
    except (OSError, ValueError, IndexError):
        return None


def dbos(i):
    """steps/s per workload from dbos-bench's summary lines."""
    rates = {}
    for name in (f"dbos-{i}", f"dbos-keyed-{i}"):
        try:
            text = open(f"{out}/{name}.txt").read()
        except OSError:
            continue
        for line in text.splitlines():
            m = re.match(r"^(steps|signal|children|keyed)\s+\d+\s+(\d+)", line)
            if m:
                rates[m.group(1)] = float(m.group(2))
            m = re.match(r"^keyed: children (\d+) steps/s over the run, (\d+)/s over the children's window", line)
            if m:
                rates["keyed-children"] = float(m.group(1))
                rates["keyed-window"] = float(m.group(2))
    return rates


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def f(x, fmt="{:,.0f}"):
    return "–" if x is None else fmt.format(x)


print("| workload | " + " | ".join(f"round {i}: Wharf / DBOS / ×" for i in range(1, rounds + 1)) + " | median × | Wharf p99 ms at half rate |")
print("|---|" + "---|" * rounds + "---|---|")
for w in ("steps", "signal", "children"):
    cells, ratios, p99s = [], [], []
    for i in range(1, rounds + 1):
        r, d = wharf(f"wharf-{w}-{i}"), dbos(i).get(w)
        rate = r["steps_per_sec"] if r else None
        ratio = rate / d if rate and d else None
        ratios.append(ratio)
        p99s.append(r.get("step_to_step_p99_ms") if r else None)
        cells.append(f"{f(rate)} / {f(d)} / {f(ratio, '{:.1f}')}")
    print(f"| {w} | " + " | ".join(cells) + f" | {f(med(ratios), '{:.1f}')} | {', '.join(f(p, '{:.1f}') for p in p99s)} |")

print()
print("| keyed, children steps/s (over their window) | " + " | ".join(f"round {i}" for i in range(1, rounds + 1)) + " | median |")
print("|---|" + "---|" * rounds + "---|")
ideal = None
for r in (1, 2, 4):
    cells, rates = [], []
    for i in range(1, rounds + 1):
        k = wharf(f"wharf-keyed-r{r}-{i}")
        kk = k and k.get("keyed")
        if kk:
            ideal = kk["ideal_children_steps_per_sec"]
            rates.append(kk["children_steps_per_sec"])
            cells.append(f"{f(kk['children_steps_per_sec'])} ({f(kk['children_window_steps_per_sec'])}), "
                         f"{kk['of_ideal']:.2f} of ideal ({kk.get('of_measured_ideal', 0):.2f} measured), "
                         f"slots busy {kk.get('slots_busy', 0):.2f}, max {kk['max_running_per_key']}/key, "
                         f"{k['runner_log']['deadlocks']} deadlocks")
        else:
            rates.append(None)
            cells.append("–")
    print(f"| Wharf, {r} runner(s) | " + " | ".join(cells) + f" | {f(med(rates))} |")
cells, rates = [], []
for i in range(1, rounds + 1):
    d = dbos(i)
    rates.append(d.get("keyed-children"))
    cells.append(f"{f(d.get('keyed-children'))} ({f(d.get('keyed-window'))})")
print(f"| DBOS, partitioned queue | " + " | ".join(cells) + f" | {f(med(rates))} |")
if ideal:
    print(f"\nlimit-bound ideal: {ideal:,.0f} children steps/s (4 keys × 2 ÷ the mean step time drawn)")

print()
print("| ratelimited (200/s, burst 10) | achieved/s | of configured | most grants in any 1 s (allowed 210) | most starts in any 1 s |")
print("|---|---|---|---|---|")
for i in range(1, rounds + 1):
    r = wharf(f"wharf-ratelimited-{i}")
    rr = r and r.get("rate")
    if rr:
        print(f"| round {i} | {rr['achieved_per_second']:.1f} | {rr['of_configured']:.3f} | {rr.get('claim_max_in_1s', '–')} | {rr['max_starts_in_1s']} |")
