#!/usr/bin/env python3
"""Summarise the ansible.posix.profile_tasks recaps of a first converge and its no-change re-run
(tools/rerun-profile.sh).

    tools/rerun-profile-summary.py DIR [DIR ...]     DIR holds first.log, rerun.log, times.txt

Prints Markdown: per run the wall time, the sum of task times, the time per phase (the task name's part before
" | ", with its role), and the slowest tasks. profile_tasks lists a task once per time it ran (an included file's task
once per include), so a phase's figure is the sum over every run of its tasks.
"""
import collections
import pathlib
import re
import sys

import repo_path  # noqa: F401  tools/repo_path.py, the one bootstrap: puts collections/ on sys.path
from ansible_collections.b300.rollout.plugins.module_utils.common.md_table import table

LINE_RE = re.compile(r"^(?P<name>.+?) -{2,} (?P<s>\d+\.\d+)s$")


def recap(path):
    """[(task name, seconds)] from the TASKS RECAP of a profile_tasks log."""
    text = pathlib.Path(path).read_text(errors="replace")
    if "TASKS RECAP" not in text:
        raise SystemExit("%s: no TASKS RECAP (run with ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks)" % path)
    out = []
    for line in text.split("TASKS RECAP", 1)[1].splitlines():
        m = LINE_RE.match(line.strip())
        if m:
            out.append((m.group("name").strip(), float(m.group("s"))))
    return out


def phase(name):
    role, _, task = name.rpartition(" : ")
    head = task.split(" | ", 1)[0] if " | " in task else task
    return ("%s : %s" % (role, head)) if role else head


def times(d):
    t = {}
    for line in (pathlib.Path(d) / "times.txt").read_text().splitlines():
        m = re.match(r"^(first converge|no-change re-run): ([\d.]+) s", line)
        if m:
            t[m.group(1)] = float(m.group(2))
    return t


def summary(d, top=12):
    d = pathlib.Path(d)
    t = times(d)
    runs = {"first converge": recap(d / "first.log"), "no-change re-run": recap(d / "rerun.log")}
    out = ["### %s" % d.name, ""] + table(("", "wall", "sum of task times", "tasks run"), [
        (label, "%.1f s" % t.get(label, 0.0), "%.1f s" % sum(s for _, s in rows), "%d" % len(rows))
        for label, rows in runs.items()])
    if t.get("first converge"):
        out.append("")
        ratio = 100 * t["no-change re-run"] / t["first converge"]
        out.append("Re-run / first converge: **%.0f%%** (wall time)." % ratio)
    for label, rows in runs.items():
        by_phase = collections.Counter()
        for name, s in rows:
            by_phase[phase(name)] += s
        total = sum(by_phase.values()) or 1.0
        out += ["", "**%s: time per phase** (top %d of %d)" % (label, top, len(by_phase)), ""]
        out += table(("phase", "s", "share"), [(name, "%.1f" % s, "%.0f%%" % (100 * s / total))
                                               for name, s in by_phase.most_common(top)], escape=True)
        out += ["", "**%s: slowest tasks**" % label, ""] + table(("task", "s"), [
            (name, "%.2f" % s) for name, s in sorted(rows, key=lambda r: -r[1])[:top]], escape=True)
        wh = [(n, s) for n, s in rows if "Wheelhouse |" in n]
        if wh:
            out.append("")
            out.append("Wheelhouse tasks: %d runs, %.1f s in all (%.0f%% of the task time)." % (
                len(wh), sum(s for _, s in wh), 100 * sum(s for _, s in wh) / total))
    return "\n".join(out) + "\n"


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for d in argv:
        print(summary(d))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
