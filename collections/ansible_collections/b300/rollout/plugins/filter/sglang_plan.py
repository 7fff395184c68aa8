# -*- coding: utf-8 -*-
"""Filters sglang_plan_views and sglang_plan_text: the plan as the units carry it (module_utils/sglang/sglang_plan.py).

Used by roles/sglang/tasks/plan.yml ("Validate | show the plan", printed by every preflight) and
playbooks/plan.yml (`make plan`). Documentation: sglang_plan_views.yml, sglang_plan_text.yml next to this file.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.b300.rollout.plugins.module_utils.sglang.sglang_plan import front_view, instance_view, plan_text, router_view


def sglang_plan_views(rendered, unit_dir="/etc/systemd/system"):
    """[{kind: instance|router|front, plan: <plan entry; the router for front>, unit: <rendered unit>, env: <rendered
    env file; the front's config>}] -> views."""
    views = []
    for item in rendered or []:
        make = {"instance": instance_view, "router": router_view, "front": front_view}.get(item.get("kind"))
        if make is None:
            raise AnsibleFilterError("sglang_plan_views: kind %r is not instance, router or front" % item.get("kind"))
        views.append(make(item["plan"], item.get("unit") or "", item.get("env") or "", unit_dir=unit_dir))
    return views


def sglang_plan_text(views):
    """Views (from sglang_plan_views, one host's or every host's) -> the plan text."""
    return plan_text(list(views or []))


class FilterModule:
    """The plan as the units carry it."""

    def filters(self):
        return {"sglang_plan_views": sglang_plan_views, "sglang_plan_text": sglang_plan_text}
