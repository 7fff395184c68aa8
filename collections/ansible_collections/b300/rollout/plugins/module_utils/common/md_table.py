# -*- coding: utf-8 -*-
"""The one Markdown table writer of the reports (issue 39: six reports wrote their tables by hand): the firmware
update, the triage, the sweep, the quality gate, the acceptance report, and the commands under tools/ (the role
READMEs, the re-run profile). Cells are printed with str(), so numbers are formatted by the caller ("%.2f" % x); an
empty cell prints as one space (`| |`)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type


def row(cells, escape=False):
    """One table line: `| a | b |`; with escape, a `|` inside a cell is written `\\|`."""
    out = []
    for c in cells:
        c = str(c)
        if escape:
            c = c.replace("|", "\\|")
        out.append(" %s " % c if c else " ")
    return "|" + "|".join(out) + "|"


def table(header, rows=(), escape=False):
    """The lines of a table: the header, the `|---|` separator, one line per row (a sequence of cells)."""
    return [row(header), "|" + "---|" * len(header)] + [row(r, escape) for r in rows]
