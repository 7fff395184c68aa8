# -*- coding: utf-8 -*-
"""Strategy b300.rollout.mitogen_linear: Ansible's linear strategy with Mitogen's connection layer (opt-in:
ANSIBLE_STRATEGY=b300.rollout.mitogen_linear), or the builtin linear strategy where Mitogen is not installed."""
from __future__ import annotations

DOCUMENTATION = r"""
name: mitogen_linear
author: b300-rollout maintainers (@b300-rollout)
short_description: The linear strategy over Mitogen's connections (one Python interpreter per host and run)
description:
  - >-
    The builtin C(linear) strategy (every host runs each task before the next task starts) with the connection
    layer of Mitogen for Ansible (the C(mitogen) package, pinned in requirements.txt): one Python interpreter is
    started on each host per run and keeps running; each task's module runs inside it instead of a new C(python3)
    per task that unpacks the module's AnsiballZ payload first. Task order, results, check mode, C(become),
    C(no_log) and the play's outcome are Ansible's.
  - >-
    Measured on the sandbox (docs/rerun-profile.md): a no-change C(playbooks/sglang_deploy.yml) run, both hosts,
    67 CPU-seconds with C(linear) (34 on the controller, 33 on the hosts) and 34 with this strategy (28 and 5.4),
    the same recap.
  - >-
    Where the C(ansible_mitogen) package cannot be imported (a controller that installed only ansible-core, the
    offline GPU machine's carried wheels without it), this plugin IS the builtin C(linear) strategy and says so once
    per run; nothing else changes.
  - >-
    Opt-in, not ansible.cfg's default (the builtin C(linear)): run a playbook with
    C(ANSIBLE_STRATEGY=b300.rollout.mitogen_linear). Under it the weights stage fails on the sandbox: the
    controller's source server (an C(async) C(poll 0) task delegated to localhost, roles/model_weights) never
    listens (docs/rerun-profile.md). The reachability listener that failed under it before now announces itself
    with a ready file and passes.
    ansible-core 2.19 prints a deprecation warning for every strategy that is not builtin
    (no replacement is planned for them); Mitogen 0.3.54 supports ansible-core 2.19 to 2.21.
options: {}
"""

from ansible.utils.display import Display

try:
    import ansible_mitogen.loaders
    import ansible_mitogen.strategy
except ImportError as exc:          # Mitogen not installed: the builtin linear strategy, said once
    _WHY = str(exc)
    from ansible.plugins.strategy.linear import StrategyModule as _Linear

    class StrategyModule(_Linear):
        """The builtin linear strategy (ansible_mitogen is missing)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            Display().warning("b300.rollout.mitogen_linear: Mitogen is not installed here (%s): running the builtin "
                              "linear strategy (slower, same results); install it with `pip install -r "
                              "requirements.txt`, or set ANSIBLE_STRATEGY=linear to silence this" % _WHY)
else:
    class StrategyModule(ansible_mitogen.strategy.StrategyMixin,
                         ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)):
        """Mitogen's StrategyMixin over the builtin linear strategy (as Mitogen's own mitogen_linear does)."""
