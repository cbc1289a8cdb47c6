#!/usr/bin/env python3
"""Plot a soak's samples (benches/soak.sh) and sum them up.

    soak_plot.py REDB_CSV POSTGRES_CSV OUT_PNG

One panel per quantity, a line per gateway; then a table, per run and
gateway, of each quantity's mean over the first and the last ten minutes
(a quantity that grows without bound shows there).
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUANTITIES = [
    ("rss_kib", "resident memory (KiB)"),
    ("fds", "open descriptors"),
    ("threads", "threads"),
    ("tasks", "runtime tasks"),
    ("store_kib", "store (KiB)"),
    ("audit_kib", "audit log (KiB)"),
    ("notifications_queued", "queued notifications"),
    ("pending_proposals", "pending proposals"),
]


def load(path):
    rows = list(csv.DictReader(open(path)))
    by = {}
    for r in rows:
        by.setdefault(r["gateway"], []).append(r)
    return by


def main():
    redb, pg, out = sys.argv[1:4]
    runs = [("redb", load(redb)), ("PostgreSQL", load(pg))]
    fig, axes = plt.subplots(4, 2, figsize=(12, 13))
    for ax, (key, title) in zip(axes.flat, QUANTITIES):
        for name, by in runs:
            for g, rows in sorted(by.items()):
                if key == "store_kib" and name == "PostgreSQL" and g != "0":
                    continue  # one database for both
                xs = [float(r["minute"]) for r in rows]
                ys = [float(r[key]) for r in rows]
                label = f"{name}" + (f", gateway {g}" if len(by) > 1 and key != "store_kib" else "")
                ax.plot(xs, ys, label=label)
        ax.set_title(title)
        ax.set_xlabel("minute")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("countersign soak: steady mixed traffic with approvals, a webhook and traces")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print(f"| run | gateway | quantity | mean, minutes 0-10 | mean, last 10 minutes |")
    print("|---|---|---|---|---|")
    for name, by in runs:
        for g, rows in sorted(by.items()):
            end = max(float(r["minute"]) for r in rows)
            first = [r for r in rows if float(r["minute"]) <= 10]
            last = [r for r in rows if float(r["minute"]) >= end - 10]
            for key, title in QUANTITIES:
                mean = lambda rs: sum(float(r[key]) for r in rs) / max(len(rs), 1)  # noqa: E731
                print(f"| {name} | {g} | {title} | {mean(first):,.0f} | {mean(last):,.0f} |")


if __name__ == "__main__":
    main()
