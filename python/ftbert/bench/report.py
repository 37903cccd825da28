"""What a sweep leaves behind: a rich table on the terminal, JSON and CSV files, a PNG plot."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

# CSV columns, in order; the JSON rows hold the same keys (those a row has).
FIELDS = (
    "device", "dtype", "batch", "seq", "varlen_min", "tokens", "engine", "kernel", "status",
    "median_ms", "p90_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "iters", "seq_per_s",
    "tok_per_s", "speedup_vs_sdpa", "max_abs_err", "weights_mib", "act_mib", "peak_mib",
    "mem_source", "note", "error",
)


def _clean(v):
    """JSON has no NaN/inf: write them as strings rather than produce a file parsers reject."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_clean(x) for x in v]
    return v


def write_json(path: Path, meta: dict, rows: list[dict], fields=FIELDS) -> None:
    doc = dict(meta)
    doc["results"] = [{k: r[k] for k in fields if k in r} for r in rows]
    path.write_text(json.dumps(_clean(doc), indent=2, allow_nan=False) + "\n")


def write_csv(path: Path, rows: list[dict], fields=FIELDS) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") if r.get(k) is not None else "" for k in fields})


def plot_png(path: Path, rows: list[dict], title: str) -> bool:
    """Median latency vs batch size, one line per engine; one subplot per sequence length, one row
    of subplots per (device, dtype). False when no configuration succeeded (nothing to draw)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return False
    groups = list(dict.fromkeys((r["device"], r["dtype"]) for r in ok))
    seqs = sorted({r["seq"] for r in ok})
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    colors = {e: plt.cm.tab10(i % 10) for i, e in enumerate(engines)}
    batches = sorted({r["batch"] for r in ok})
    fig, axes = plt.subplots(
        len(groups), len(seqs), figsize=(4.2 * len(seqs), 3.2 * len(groups) + 0.8), squeeze=False,
        layout="constrained",
    )
    for gi, (device, dtype) in enumerate(groups):
        for si, seq in enumerate(seqs):
            ax = axes[gi][si]
            for e in engines:
                pts = sorted(
                    (r["batch"], r["median_ms"]) for r in ok
                    if r["engine"] == e and r["device"] == device and r["dtype"] == dtype and r["seq"] == seq
                )
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=e, color=colors[e])
            ax.set_title(f"{device} {dtype}, seq {seq}", fontsize=9)
            ax.set_xlabel("batch size")
            ax.set_ylabel("median latency (ms)")
            ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.minorticks_off()
            ax.set_yscale("log")
            # 20, not 2×10¹; between decades only the 2s and 5s, so the labels stay apart.
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:e}"[0] in "25" else ""))
            ax.grid(True, which="both", alpha=0.3)
    handles, labels = [], []
    for ax in axes.flat:  # one legend for the figure, from whichever subplots drew each engine
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.suptitle(title, fontsize=10)
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _fmt(v, spec: str) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, str):
        return v
    return format(v, spec)


def print_grouped_tables(console, rows: list[dict], title: str, columns: tuple[str, ...],
                         left: tuple[str, ...], cells) -> None:
    """One table per (device, dtype) of `rows`, titled "device  dtype  title"; `cells(row)` gives a
    row's cells before its status column. Why a row failed or was skipped (and an ok row's note)
    goes in numbered notes below its table, so long messages do not squeeze the columns."""
    from rich.markup import escape
    from rich.table import Table

    for device, dtype in dict.fromkeys((r["device"], r["dtype"]) for r in rows):
        t = Table(title=f"{device}  {dtype}  {title}".rstrip(), title_justify="left", header_style="bold")
        for name in (*columns, "status"):
            t.add_column(name, justify="left" if name in (*left, "status") else "right", no_wrap=True)
        footnotes: list[str] = []

        def ref(text: str) -> str:
            if text not in footnotes:
                footnotes.append(text)
            return f"[{footnotes.index(text) + 1}]"

        for r in rows:
            if (r["device"], r["dtype"]) != (device, dtype):
                continue
            if r["status"] == "ok":
                status = "[green]ok[/]" + (" " + escape(ref(r["note"])) if r.get("note") else "")
            elif r["status"] == "skipped":
                status = "[yellow]skipped[/] " + escape(ref(r.get("note") or ""))
            else:
                status = "[red]failed[/] " + escape(ref(r.get("error") or ""))
            t.add_row(*cells(r), status)
        console.print(t)
        for i, text in enumerate(footnotes, 1):
            console.print(f"  [{i}] {escape(text)}", soft_wrap=True)


def print_table(console, rows: list[dict]) -> None:
    """The sweep's tables (print_grouped_tables)."""
    print_grouped_tables(
        console, rows, "",
        ("batch", "seq", "engine", "kernel", "median ms", "p90 ms", "p99 ms", "seq/s", "tok/s",
         "peak MiB", "× sdpa", "max err"),
        ("engine", "kernel"),
        lambda r: (
            str(r["batch"]), str(r["seq"]), r["engine"], r.get("kernel") or "-",
            _fmt(r.get("median_ms"), ".3f"), _fmt(r.get("p90_ms"), ".3f"),
            _fmt(r.get("p99_ms"), ".3f"), _fmt(r.get("seq_per_s"), ",.0f"),
            _fmt(r.get("tok_per_s"), ",.0f"), _fmt(r.get("peak_mib"), ",.1f"),
            _fmt(r.get("speedup_vs_sdpa"), ".2f"), _fmt(r.get("max_abs_err"), ".2e"),
        ),
    )
