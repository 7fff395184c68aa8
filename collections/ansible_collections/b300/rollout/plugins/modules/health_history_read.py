#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: read the last hours of a host's health history (GPU dmon samples, IB/RDMA counters). Read-only."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: health_history_read
short_description: Summarise a host's GPU temperature/clock/violation and RDMA counter history over a window
description:
  - Reads the files the C(b300-health-history) sampler (role C(health_history)) writes under O(dir) and summarises
    the window [now - O(since), now] - per GPU the sample count, maximum GPU and HBM temperature, minimum SM clock,
    seconds of thermal and power violation, and whether it was hot (first hot moment included); per RDMA device
    the increase of every port counter (C(counters/) and C(hw_counters/)) inside the window; and the series the
    temperature/clock/throttle plot needs (C(tools/plot_thermal.py --history)).
  - Hot - a sample above O(hot_temp_c) (default 90 C, the thermal soak's ceiling; the seed's B300s throttled at
    96 C), or any thermal violation (dmon C(tviol)), which DCGM fails a diagnostic on
    (C(../shared/reference/oncall-triage-anchors.md) R12).
  - Reads only. When the directory or samples in the window are missing the result says so (RV(available) false,
    RV(reason)); the module does not fail for that, so a triage can go on with its other checks.
version_added: "1.0.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: Reads files only; the same result in check mode.
options:
  since:
    description:
      - Length of the window ending now, e.g. C(6h), C(90m), C(1h30m), C(45s), C(2d); a bare number is seconds.
    type: str
    default: 6h
  dir:
    description: The sampler's history directory on the host (role default C(/var/lib/b300-health-history)).
    type: path
    default: /var/lib/b300-health-history
  hot_temp_c:
    description: A GPU sample above this temperature (C) makes the GPU hot.
    type: float
    default: 90.0
  plot_points:
    description: Largest number of points per GPU in RV(plot_data) (time buckets keep the maximum temperature and
      the minimum clock of each bucket).
    type: int
    default: 600
  plot_context:
    description: History before the window included in RV(plot_data) so the plot shows what led up to it (same
      forms as O(since); C(0) for none).
    type: str
    default: 30m
"""

EXAMPLES = r"""
- name: Was it hot when it hung?
  b300.rollout.health_history_read:
    since: 6h
  register: history

- name: Name the hot GPUs
  ansible.builtin.debug:
    msg: "{{ history.gpus | dict2items | selectattr('value.hot') | map(attribute='key') | list }}"
"""

RETURN = r"""
available:
  description: True when at least one sample lies inside the window.
  returned: always
  type: bool
reason:
  description: Why nothing is available (no directory, no sample in the window); null when available.
  returned: always
  type: str
window:
  description: The window read (epoch seconds) and what the history held inside it.
  returned: always
  type: dict
  contains:
    start_epoch:
      description: now - since.
      type: float
    end_epoch:
      description: now (the host's clock).
      type: float
    first_sample_epoch:
      description: First sample inside the window (null when none).
      type: float
    last_sample_epoch:
      description: Last sample inside the window (null when none).
      type: float
    samples:
      description: Sample records inside the window.
      type: int
gpus:
  description: Per GPU index (string key).
  returned: always
  type: dict
  contains:
    samples:
      description: dmon samples of this GPU inside the window.
      type: int
    max_temp_c:
      description: Highest GPU temperature (dmon gtemp).
      type: float
    max_mem_temp_c:
      description: Highest HBM temperature (dmon mtemp; null when the driver does not report it).
      type: float
    min_sm_clock_mhz:
      description: Lowest SM clock (dmon pclk).
      type: float
    max_power_w:
      description: Highest power draw.
      type: float
    thermal_violation_s:
      description: Seconds covered by samples with a thermal violation (dmon tviol > 0).
      type: float
    power_violation_s:
      description: Seconds of power capping (sum of dmon pviol % x each sample's duration).
      type: float
    hot:
      description: True when a sample was above hot_temp_c or had a thermal violation.
      type: bool
    first_hot_epoch:
      description: The first such sample (epoch seconds), null when never hot.
      type: float
    hot_reasons:
      description: Why it is hot, in words (empty when not hot).
      type: list
      elements: str
  sample: {"3": {"samples": 2160, "max_temp_c": 96, "max_mem_temp_c": 91, "min_sm_clock_mhz": 1275,
                 "max_power_w": 954, "thermal_violation_s": 912.0, "power_violation_s": 0.0, "hot": true,
                 "first_hot_epoch": 1796176053.754, "hot_reasons": ["max temperature 96 C above 90 C"]}}
nics:
  description: Per RDMA device (C(mlx5_N) for port 1, C(mlx5_N:P) for port P), every sampled counter and its
    increase inside the window (0 when unchanged; a counter reset counts the new value).
  returned: always
  type: dict
  sample: {"mlx5_3": {"local_ack_timeout_err": 3412, "link_downed": 0, "symbol_error": 0}}
plot_data:
  description: Series for C(tools/plot_thermal.py --history) (times in seconds since C(t0), the plot start =
    window start - plot_context), downsampled to plot_points per GPU; C(window) the window in the same seconds.
  returned: always
  type: dict
  contains:
    t0:
      description: Plot start, epoch seconds.
      type: float
    window:
      description: "[start, end] of the window in seconds since t0."
      type: list
      elements: float
    window_epoch:
      description: "[start, end] of the window, epoch seconds."
      type: list
      elements: float
    hot_temp_c:
      description: The hot threshold used.
      type: float
    gpus:
      description: Per GPU index - t, temp_c, mem_temp_c, sm_mhz, power_w (lists of equal length),
        throttled_intervals (thermal-violation stretches, [start, end] seconds since t0) and hot.
      type: dict
hot_temp_c:
  description: The hot threshold used (C).
  returned: always
  type: float
events:
  description: Sampler events inside the window (dmon exits and restarts, stalls, unreadable counters).
  returned: always
  type: list
  elements: dict
files_read:
  description: History files read (names, oldest first).
  returned: always
  type: list
  elements: str
skipped_lines:
  description: Lines that were not complete records (a line being written while read).
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.b300.rollout.plugins.module_utils.health.health_history import HOT_TEMP_C, parse_duration, read_window


def main():
    module = AnsibleModule(
        argument_spec=dict(
            since=dict(type="str", default="6h"),
            dir=dict(type="path", default="/var/lib/b300-health-history"),
            hot_temp_c=dict(type="float", default=HOT_TEMP_C),
            plot_points=dict(type="int", default=600),
            plot_context=dict(type="str", default="30m"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        since_s = parse_duration(p["since"])
        context_s = 0.0 if str(p["plot_context"]).strip() in ("0", "") else parse_duration(p["plot_context"])
    except ValueError as e:
        module.fail_json(msg="health_history_read: %s" % e)
    if p["plot_points"] < 10:
        module.fail_json(msg="health_history_read: plot_points %d is below 10" % p["plot_points"])
    res = read_window(p["dir"], since_s, hot_temp_c=p["hot_temp_c"], plot_points=p["plot_points"],
                      plot_context_s=context_s)
    module.exit_json(changed=False, **res)


if __name__ == "__main__":
    main()
