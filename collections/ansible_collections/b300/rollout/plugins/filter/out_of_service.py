# -*- coding: utf-8 -*-
"""Filter out_of_service_mode: what taking a host out of service means - none | rolling | outage, and whether it is
allowed (module_utils/firmware/fw_update.py service_mode, the firmware update's rule, tested in
tests/unit/test_fw_update.py). playbooks/host_stack.yml decides with it whether a serving host may be rebooted (PD or
the router's host only with nic_firmware_update_maintenance=true). Documentation: out_of_service_mode.yml next to
this file."""

from __future__ import annotations

from ansible_collections.b300.rollout.plugins.module_utils.firmware.fw_update import service_mode


def out_of_service_mode(instances, host, router_hosts=(), maintenance=False):
    """The SGLang plan's instances, the host, the router's hosts, the maintenance flag -> service_mode's dict."""
    return service_mode(list(instances or []), host, list(router_hosts or []), bool(maintenance))


class FilterModule:
    """The out-of-service rule shared by the firmware update and the host stack."""

    def filters(self):
        return {"out_of_service_mode": out_of_service_mode}
