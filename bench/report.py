"""Render ``RESULTS.md`` and one PNG per benchmark from every ``results/*.json``.

Everything between the BEGIN and END markers is rewritten on each run; text
outside them (hand-written analysis, the before/after of an optimisation) is
kept as it is.  Benchmarks are listed in the order of :data:`bench.BENCHMARKS`,
then any others by name, so results written by other benchmarks appear too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from . import BENCHMARKS

BEGIN = "<!-- BEGIN GENERATED RESULTS: rewritten by `python -m bench`; edit outside -->"
END = "<!-- END GENERATED RESULTS -->"
HEADER = "# stager benchmark results\n\n"
HAND_WRITTEN = "\n\n## Notes (written by hand; kept when the results are re-rendered)\n\n"


def load_results(out: Path) -> list[dict[str, Any]]:
    results = []
    for path in sorted((out / "results").glob("*.json")):
        try:
            body = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(body, dict) and "rows" in body:
            body.setdefault("name", path.stem)
            results.append(body)
    rank = {name: i for i, name in enumerate(BENCHMARKS)}
    return sorted(results, key=lambda r: (rank.get(r["name"], len(BENCHMARKS)), r["name"]))


def render(out: Path) -> Path:
    """Rewrite the generated part of ``out/RESULTS.md``; returns its path."""
    results = load_results(out)
    plots = {r["name"]: p for r in results if (p := plot(r, out / "plots")) is not None}
    block = "\n".join([BEGIN, _summary(results), *(_section(r, plots.get(r["name"]), out)
                                                   for r in results), END])
    md = out / "RESULTS.md"
    old = md.read_text() if md.exists() else ""
    if BEGIN in old and END in old:
        before = old[:old.index(BEGIN)]
        after = old[old.index(END) + len(END):]
    else:
        before, after = HEADER, HAND_WRITTEN + old
    md.parent.mkdir(parents=True, exist_ok=True)
    tmp = md.with_suffix(".md.tmp")
    tmp.write_text(before + block + after)
    tmp.replace(md)
    return md


def _summary(results: list[dict[str, Any]]) -> str:
    lines = ["", "Rerun everything with `python -m bench` (or `stager bench`) from the "
             "repository root; `--quick` for the smoke-test sizes.", "",
             "| benchmark | aims met | measured | mode |", "| --- | --- | --- | --- |"]
    for r in results:
        aims = r.get("aims") or {}
        met = sum(bool(a.get("met")) for a in aims.values())
        date = (r.get("machine") or {}).get("date", "?")
        mode = "quick" if r.get("quick") else "full"
        met_text = f"{met}/{len(aims)}" if aims else "none set"
        lines.append(f"| [{r.get('title', r['name'])}](#{r['name']}) | "
                     f"{met_text} | {date} | {mode} |")
    return "\n".join(lines) + "\n"


def _section(r: dict[str, Any], png: Path | None, out: Path) -> str:
    lines = [f'<a id="{r["name"]}"></a>', f"## {r.get('title', r['name'])}", "",
             f"Rerun: `{r.get('command', 'python -m bench ' + r['name'])}`"
             + (" (quick sizes)" if r.get("quick") else ""), "",
             _machine_line(r), ""]
    lines += _table(r["columns"], r["rows"])
    if r.get("ratios"):
        lines += ["", "Ratios (same run, side by side):", ""]
        lines += [f"- {k}: **{_fmt(v)}**" for k, v in r["ratios"].items()]
    if r.get("aims"):
        lines += ["", "| aim | value | target | met |", "| --- | --- | --- | --- |"]
        for k, a in r["aims"].items():
            lines.append(f"| {k} | {_fmt(a.get('value'))} | {a.get('aim', '')} | "
                         f"{'yes' if a.get('met') else 'no'} |")
    if r.get("notes"):
        lines += ["", *[f"- {n}" for n in r["notes"]]]
    if png is not None:
        lines += ["", f"![{r['name']}]({png.relative_to(out).as_posix()})"]
    return "\n".join(lines) + "\n"


def _machine_line(r: dict[str, Any]) -> str:
    m = r.get("machine") or {}
    pk = m.get("packages") or {}
    commit = (m.get("git_commit") or "?")[:10] + (" (uncommitted changes)"
                                                  if m.get("git_dirty") else "")
    return (f"Measured {m.get('date', '?')} on {m.get('cores', '?')} cores "
            f"({m.get('cpu', '?')}), {m.get('memory_gib', '?')} GiB, kernel "
            f"{m.get('kernel', '?')}, Python {m.get('python', '?')}, aiohttp "
            f"{pk.get('aiohttp', '?')}, commit {commit}; load average "
            f"{m.get('load_average', '?')}; took {r.get('seconds', '?')} s.")


def _table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(map(str, columns)) + " |",
           "| " + " | ".join("---" for _ in columns) + " |"]
    out += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v).replace("|", "\\|")


# -- plots ------------------------------------------------------------------------------
def plot(r: dict[str, Any], folder: Path) -> Path | None:
    """A PNG of the result's ``plot`` spec (default: bars of its first numeric column)."""
    spec = r.get("plot") or _default_spec(r)
    if spec is None:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cols = list(r["columns"])
    try:
        xi = cols.index(spec["x"])
        ys = [(y, cols.index(y)) for y in spec["y"]]
    except (KeyError, ValueError):
        return None
    labels = [str(row[xi]) for row in r["rows"]]
    fig, ax = plt.subplots(figsize=(9, max(3.0, 0.45 * len(labels) + 1.5))
                           if spec.get("kind") == "barh" else (8, 4.5))
    _draw(ax, spec, labels, [(y, [_num(row[i]) for row in r["rows"]]) for y, i in ys])
    ax.set_title(r.get("title", r["name"]), fontsize=10)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{r['name']}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _draw(ax: Any, spec: dict[str, Any], labels: list[str],
          series: list[tuple[str, list[float]]]) -> None:
    kind = spec.get("kind", "bar")
    if kind == "line":
        for name, values in series:
            ax.plot(labels, values, marker="o", label=name)
        ax.set_xlabel(spec["x"])
        ax.set_ylabel(spec.get("ylabel", ""))
    else:
        width = 0.8 / len(series)
        # One series: stager's bars in colour, the baselines in grey.
        ours = ["C0" if label.lower().startswith("stager") else "C7" for label in labels]
        for k, (name, values) in enumerate(series):
            pos = [i + k * width for i in range(len(labels))]
            color = ours if len(series) == 1 else None
            if kind == "barh":
                ax.barh(pos, values, height=width, label=name, color=color)
            else:
                ax.bar(pos, values, width=width, label=name, color=color)
        ticks = [i + width * (len(series) - 1) / 2 for i in range(len(labels))]
        if kind == "barh":
            ax.set_yticks(ticks, labels, fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel(spec.get("ylabel", ""))
        else:
            ax.set_xticks(ticks, labels, fontsize=8, rotation=20, ha="right")
            ax.set_ylabel(spec.get("ylabel", ""))
    if spec.get("logy"):
        (ax.set_xscale if kind == "barh" else ax.set_yscale)("log")
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def _default_spec(r: dict[str, Any]) -> dict[str, Any] | None:
    cols, rows = r.get("columns") or [], r.get("rows") or []
    if len(cols) < 2 or not rows:
        return None
    for i, c in enumerate(cols[1:], 1):
        if all(isinstance(row[i], int | float) and not isinstance(row[i], bool)
               for row in rows):
            return {"kind": "barh", "x": cols[0], "y": [c], "ylabel": str(c)}
    return None


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")
