#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: read and change which workers an sglang-router routes to (its /workers API)."""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

DOCUMENTATION = r"""
---
module: sglang_router_members
short_description: Read and change the workers an sglang-router routes to (GET/POST/DELETE /workers)
description:
  - Runs on the router host against the router's own URL. The API key, when the router has one, is read from the
    router's env file (O(env_file), the C(SGLANG_API_KEY) line the role writes); it is sent as
    the C(Authorization) bearer token and, on C(POST /workers), as the worker's C(api_key); it is never a module argument,
    never returned and masked in any message.
  - O(state=query) lists the workers. O(state=healthy) waits until every worker of O(workers) is listed healthy (it
    never adds one; a router started with C(--worker-urls) registers them itself). O(state=absent) removes the
    workers of O(workers) (looked up by URL, ids are random per registration) and waits until the router no longer
    lists them; with O(others) it first checks that those are listed healthy and fails without removing anything
    if not. O(state=present) adds the workers of O(workers) the router does not list and waits until all are
    listed healthy.
  - The decisions and messages are plain functions in C(module_utils/sglang/sglang_rollout.py) (C(workers_view),
    C(membership_check), C(worker_body), C(missing_workers), C(unhealthy_workers)).
  - sglang-router 0.3.2 semantics (C(../shared/reference/sglang-router-contract.md) §5, copied in the project's
    tests); DELETE answers 202 and the worker is gone within about 0.5 s; POST answers 202/200 and the worker is
    healthy after its first health check.
version_added: "1.2.0"
extends_documentation_fragment: [ansible.builtin.action_common_attributes, b300.rollout.common]
attributes:
  check_mode:
    support: full
    details: C(GET /workers) runs; nothing is added or removed, RV(added) / RV(removed) say what would be.
options:
  url:
    description: The router's base URL as seen from the router host (e.g. C(http://127.0.0.1:30080)).
    type: str
    required: true
  env_file:
    description: The router's env file; its C(SGLANG_API_KEY) line (if any) is the key used. Empty or missing file =
      no key.
    type: path
  state:
    description: What to do (see the description).
    type: str
    choices: [query, healthy, absent, present]
    default: query
  workers:
    description:
      - Planned router workers, each with C(url) and C(id) (the instance id, for messages), and for O(state=present)
        C(worker_type) (C(regular), C(prefill), C(decode)) and C(bootstrap_port) (prefill only).
    type: list
    elements: dict
    default: []
  others:
    description: With O(state=absent), planned workers (C(id), C(url)) that must be listed healthy before anything is
      removed.
    type: list
    elements: dict
    default: []
  timeout:
    description: Seconds to wait for the change (or, with O(state=healthy), the health) to show in C(GET /workers).
    type: int
    default: 60
  poll:
    description: Seconds between two C(GET /workers) while waiting.
    type: float
    default: 1.0
  missing_ok:
    description: With O(state=query), a router that does not answer 200 gives RV(reachable) false and no workers
      instead of a failure (the first deploy has no router yet).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Take W0 out of the router (the others must be healthy first)
  b300.rollout.sglang_router_members:
    url: http://127.0.0.1:30080
    env_file: /etc/sglang/router.env
    state: absent
    workers: [{id: W0, url: "http://10.0.0.11:30000"}]
    others: [{id: W0-b, url: "http://10.0.0.12:30000"}]

- name: Put it back and wait until it is healthy
  b300.rollout.sglang_router_members:
    url: http://127.0.0.1:30080
    env_file: /etc/sglang/router.env
    state: present
    workers: [{id: W0, url: "http://10.0.0.11:30000", worker_type: regular, bootstrap_port: null}]
    timeout: 600
"""

RETURN = r"""
reachable:
  description: Whether the router answered C(GET /workers) with 200.
  returned: always
  type: bool
  sample: true
workers:
  description: The workers the router lists at the end (C(id), C(url), C(worker_type), C(is_healthy)).
  returned: always
  type: list
  elements: dict
  sample: [{"id": "5f0c...", "url": "http://10.0.0.11:30000", "worker_type": "regular", "is_healthy": true}]
listed_urls:
  description: The URLs of RV(workers).
  returned: always
  type: list
  elements: str
  sample: ["http://10.0.0.11:30000"]
removed:
  description: Ids (instance ids of O(workers)) removed (in check mode, that would be removed).
  returned: always
  type: list
  elements: str
  sample: ["W0"]
added:
  description: Ids (instance ids of O(workers)) added (in check mode, that would be added).
  returned: always
  type: list
  elements: str
  sample: []
elapsed:
  description: Seconds the module waited.
  returned: always
  type: float
  sample: 1.4
"""

import json
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import open_url
from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_rollout as ro


class Router:
    def __init__(self, module, url, key):
        self.module, self.url, self.key = module, url.rstrip("/"), key

    def call(self, method, path, body=None, timeout=10):
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = "Bearer " + self.key
        data = json.dumps(body) if body is not None else None
        try:
            resp = open_url(self.url + path, method=method, data=data, headers=headers, timeout=timeout,
                            validate_certs=False)
            return resp.getcode(), resp.read().decode("utf-8", "replace")
        except HTTPError as e:
            return e.code, e.read().decode("utf-8", "replace")[:300]
        except (URLError, OSError, ValueError) as e:
            return None, str(getattr(e, "reason", e))

    def listing(self):
        status, text = self.call("GET", "/workers")
        if status != 200:
            return None, "GET %s/workers -> %s %s" % (self.url, status, text.strip()[:200])
        try:
            return ro.workers_view(json.loads(text)), ""
        except ValueError as e:
            return None, "GET %s/workers: not JSON (%s)" % (self.url, e)


def read_key(module, env_file):
    if not env_file:
        return ""
    try:
        with open(env_file) as fh:
            key = ro.env_api_key(fh.read())
    except OSError:
        return ""
    if key:
        module.no_log_values.add(key)
    return key


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            env_file=dict(type="path"),
            state=dict(type="str", default="query", choices=["query", "healthy", "absent", "present"]),
            workers=dict(type="list", elements="dict", default=[]),
            others=dict(type="list", elements="dict", default=[]),
            timeout=dict(type="int", default=60),
            poll=dict(type="float", default=1.0),
            missing_ok=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for w in p["workers"] + p["others"]:
        if not isinstance(w.get("url"), str) or not w.get("url"):
            module.fail_json(msg="sglang_router_members: every worker needs a url: %r" % w)
        w.setdefault("id", w["url"])
    router = Router(module, p["url"], read_key(module, p["env_file"]))
    t0 = time.time()
    result = dict(changed=False, reachable=False, workers=[], listed_urls=[], removed=[], added=[], elapsed=0.0)

    def done(view, **kw):
        result.update(workers=view, listed_urls=[w["url"] for w in view], elapsed=round(time.time() - t0, 1), **kw)
        module.exit_json(**result)

    def fail(msg, view=None):
        result.update(workers=view or [], elapsed=round(time.time() - t0, 1))
        module.fail_json(msg="%s: %s" % (p["url"], msg), **result)

    view, err = router.listing()
    if view is None:
        if p["state"] == "query" and p["missing_ok"]:
            done([])
        fail("the router does not answer: %s; expected 200 with its worker list (is the router running? "
             "journalctl -u 'sglang-*router*' on the router host)" % err)
    result["reachable"] = True

    def wait(until, what):
        cur = view
        while True:
            if until(cur):
                return cur
            if time.time() - t0 >= p["timeout"]:
                fail("%s not reached within %d s; the router lists: %s" % (
                    what, p["timeout"], ", ".join("%s healthy=%s" % (w["url"], w["is_healthy"]) for w in cur)
                    or "no worker"), cur)
            time.sleep(p["poll"])
            nxt, nerr = router.listing()
            cur = nxt if nxt is not None else cur

    if p["state"] == "query":
        done(view)
    if p["state"] == "healthy":
        names = ", ".join(w["id"] for w in p["workers"])
        done(wait(lambda v: not ro.unhealthy_workers(p["workers"], v), "every planned worker (%s) healthy" % names))
    if p["state"] == "absent":
        for leaving in p["workers"]:
            msg = ro.membership_check(leaving, p["others"], view, p["url"])
            if msg:
                fail(msg, view)
        urls = {w["url"]: w["id"] for w in p["workers"]}
        gone = [w for w in view if w["url"] in urls]
        result["removed"] = [urls[w["url"]] for w in gone]
        result["changed"] = bool(gone)
        if module.check_mode or not gone:
            done(view)
        for w in gone:
            status, text = router.call("DELETE", "/workers/%s" % w["id"])
            if status not in (200, 202, 204):
                what = (w["id"], urls[w["url"]], w["url"], status, text.strip()[:200])
                fail("DELETE /workers/%s (%s, %s) -> %s %s" % what, view)
        done(wait(lambda v: not [w for w in v if w["url"] in urls], "%s out of the router" % ", ".join(urls.values())))
    # present
    missing = ro.missing_workers(p["workers"], view)
    result["added"] = [w["id"] for w in missing]
    result["changed"] = bool(missing)
    if module.check_mode:
        done(view)
    for w in missing:
        status, text = router.call("POST", "/workers", ro.worker_body(w, router.key))
        if status not in (200, 201, 202):
            fail("POST /workers for %s (%s) -> %s %s" % (w["id"], w["url"], status, text.strip()[:200]), view)
    names = ", ".join(w["id"] for w in p["workers"])
    done(wait(lambda v: not ro.unhealthy_workers(p["workers"], v), "%s listed healthy" % names))


if __name__ == "__main__":
    main()
