# -*- coding: utf-8 -*-
"""Filters weights_progress and weights_summary: the weights stage's lines for a person
(module_utils/weights/model_weights.py progress_line / summary_lines). Used by roles/model_weights/tasks. Documentation:
weights_progress.yml, weights_summary.yml next to this file."""

from __future__ import annotations

from ansible_collections.b300.rollout.plugins.module_utils.weights.model_weights import progress_line, summary_lines


def weights_progress(progress, host):
    """progress.json of a host's running stage -> one line (bytes, rate, ETA, files, source)."""
    return progress_line(host, progress or {})


def weights_summary(result, host):
    """The stage module's result of a host -> its summary lines."""
    return summary_lines(host, result or {})


class FilterModule:
    """The weights stage's lines."""

    def filters(self):
        return {"weights_progress": weights_progress, "weights_summary": weights_summary}
