"""`python -m bench --plot`: the results as two log-scale bar charts, in the table's convention.

Top: median ms per workload and contender. Bottom: each contender's time divided by PyTorch's (the
table's time/torch column: 1 = as fast as PyTorch, 0.5 = twice as fast; lower is better in both panels).
Contenders whose times are not a device's speed (the NUMPY reference interpreter, PoCL, Mesa's lavapipe,
Triton's interpreter: `software` in the JSON's contenders) stay off the bottom panel unless asked
(`--plot-all-ratios`): hundreds of times PyTorch's time, they would squash every other bar. The title says
where and how it ran (CPU, cores, date, mode, tgrad commit); the x labels give the size that ran.
"""

from __future__ import annotations

import math
import sys
import textwrap

MISSING = ("--plot: matplotlib is not installed, so no plot can be written "
           "(pip install matplotlib, or pip install -e '.[bench]'; or leave out --plot)")


def have_matplotlib() -> bool:
    """True if matplotlib imports; else says so on stderr (the suite asks before it runs, not after)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(MISSING, file=sys.stderr)
        return False
    return True


def title(machine: dict, mode: str) -> str:
    return (f"tgrad bench {machine.get('date', '?')}, {mode}, tgrad {machine.get('commit', '?')}\n"
            f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
            f"{machine.get('threads', '?')} threads per contender")


def _room(ax, lo: float, hi: float, labelled: bool) -> None:
    """Log-scale limits with space above the tallest bar for its rotated value label."""
    decades = math.log10(hi / lo) + 0.3
    top = max(0.45, 0.3 * decades) if labelled else 0.15
    ax.set_ylim(lo / 10**0.3, hi * 10**top)


def figure(rows: list[dict], workloads: list, machine: dict, mode: str,
           software: dict[str, str] | None = None, all_ratios: bool = False):
    """The matplotlib Figure. `workloads`: objects with .name and .size; `software`: contender -> what runs
    it, for those left off the ratio panel unless `all_ratios`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    software = software or {}
    names = sorted({r["contender"] for r in rows if r.get("ms")},
                   key=lambda n: (not n.startswith("tgrad"), n))
    colors = {n: f"C{i % 10}" for i, n in enumerate(names)}
    wls = [w for w in workloads if any(r["workload"] == w.name and r.get("ms") for r in rows)]
    ms = {(r["workload"], r["contender"]): r["ms"] for r in rows if r.get("ms")}
    ratio = {(r["workload"], r["contender"]): r["time_vs_torch"] for r in rows if r.get("time_vs_torch")}
    off = [] if all_ratios else [n for n in names if n in software]
    fig, axes = plt.subplots(2, 1, figsize=(max(9, 1.3 * len(wls) + 3), 10), sharex=True)
    for ax, values, who, labelled in ((axes[0], ms, names, False),
                                      (axes[1], ratio, [n for n in names if n not in off], True)):
        width = 0.8 / max(1, len(who))
        heights = [1.0] if labelled else []
        for i, name in enumerate(who):
            pts = [(j - 0.4 + (i + 0.5) * width, values[(w.name, name)])
                   for j, w in enumerate(wls) if (w.name, name) in values]
            if not pts:
                continue
            xs, ys = zip(*pts)
            bars = ax.bar(xs, ys, width, label=name, color=colors[name])
            heights += ys
            if labelled:
                ax.bar_label(bars, [f"{y:.0f}" if y >= 10 else f"{y:.2g}" for y in ys], fontsize=6,
                             rotation=90, padding=2)
        ax.set_yscale("log")
        if heights:
            _room(ax, min(heights), max(heights), labelled)
    axes[0].set_ylabel("median ms (log scale; lower is better)")
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[1].axhline(1.0, color="black", linewidth=0.8)
    axes[1].set_ylabel("time / PyTorch's time\n(log scale; lower is better, 1 = PyTorch)")
    notes = []
    if not any(r["contender"] == "torch" and r.get("ms") for r in rows):
        axes[1].text(0.5, 0.5, "PyTorch did not run: no ratios", transform=axes[1].transAxes, ha="center")
    else:
        torch_rows = {r["workload"] for r in rows if r["contender"] == "torch" and r.get("ms")}
        refs = {r["workload"]: r["torch_ref"] for r in rows if r.get("torch_ref")}
        alone = []
        for j, w in enumerate(wls):
            if w.name in refs:
                notes.append(f"{w.name}: PyTorch has no such row, compared with PyTorch's {refs[w.name]}")
            elif w.name not in torch_rows:
                alone.append(w.name)
                axes[1].text(j, 0.04, "no PyTorch row", transform=axes[1].get_xaxis_transform(), rotation=90,
                             ha="center", va="bottom", fontsize=7, color="0.4")
        if alone:
            notes.append("no PyTorch counterpart: " + ", ".join(alone))
    if off:
        notes.append("left off this panel (--plot-all-ratios shows them): "
                     + "; ".join(f"{n} ({software[n]})" for n in off))
    axes[1].set_xlim(-0.5, len(wls) - 0.5)  # every workload's slot, bars or not (its note sits there)
    axes[1].set_xticks(range(len(wls)), [f"{w.name}\n{getattr(w, 'size', '')}".strip() for w in wls],
                       fontsize=8)
    if notes:
        width = int(14 * fig.get_figwidth())  # characters of 8-point text across the figure
        axes[1].set_xlabel("\n".join(textwrap.fill(n, width, subsequent_indent="  ") for n in notes),
                           fontsize=8, loc="left")
    fig.suptitle(title(machine, mode), fontsize=10)
    fig.tight_layout()
    return fig


def plot(rows: list[dict], workloads: list, path: str, machine: dict | None = None, mode: str = "",
         software: dict[str, str] | None = None, all_ratios: bool = False) -> bool:
    """Write the figure to `path` (PNG) and say so; False (and a message) without matplotlib."""
    if not have_matplotlib():
        return False
    import matplotlib.pyplot as plt

    fig = figure(rows, workloads, machine or {}, mode, software, all_ratios)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(f"wrote plot to {path}")
    return True
