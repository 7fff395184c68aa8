"""Plan SGLang instances and the router from a profile, inventory groups and host facts (pure, stdlib only).

Input (all plain data; see build_plan):
  profile   the profile YAML (roles/sglang_server/files/profiles/<name>.yml) after inventory overrides were merged
            (use merge_overrides), e.g. {"name": "glm52_pd", "mode": "pd", "roles": {...}, "router": {...}}
  hosts     [{"name": "b300a", "address": "10.0.0.1", "groups": ["gpu_nodes", ...],
              "gpu_topology": {...} | None, "rdma_nics": {...} | None,     # CONTRACTS.md fact schemas
              "instance_overrides": {"P0": {"gpus": [...], "ib_devices": [...], "port": N, "nccl_port": N,
                                            "bootstrap_port": N, "args": {...}, "env": {...}}}}]
  settings  {"sglang_version", "router_version", "model_root", "executable", "bind_host", "router_bind_host",
             "prometheus_host", "known_combinations": [{"sglang","router"}], "api_key_enabled": bool,
             "timeouts": {"name": seconds}, "unit_prefix": "sglang", "env_dir": "/etc/sglang",
             "extra_args": {...}, "extra_env": {...}}
  catalogs  {"server": {version: {"--flag": {"action","type","nargs","choices"}}}, "router": {version: {...}}}

Output of build_plan: {"instances": [...], "router": {...} | None, "errors": [...], "warnings": [...]}.
Every error message names the host, the instance, the flag/port/GPU and the value expected.
"""

import copy
import json
import re

from ansible_collections.b300.rollout.plugins.module_utils.affinity import nearest_nics

VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
PLACEHOLDER_RE = re.compile(r"\{([a-z_]+)\}")
ROLE_ORDER = ("prefill", "decode", "worker")
API_KEY_TOKEN = "${SGLANG_API_KEY}"
LIST_PLACEHOLDERS = ("{prefill_workers}", "{decode_workers}", "{workers}")


def merge_overrides(base, override):
    """Deep merge: dicts merge key by key, anything else (lists, scalars, None) replaces. Inputs are not changed."""
    result = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge_overrides(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def systemd_quote(arg):
    """Quote one argv element for an ExecStart= line (double quotes; `$` and `%` escaped except the API key token)."""
    if arg == API_KEY_TOKEN:
        return '"' + arg + '"'
    text = str(arg).replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return '"' + text + '"'


def exec_start_line(argv):
    return " ".join(systemd_quote(a) for a in argv)


def _scalar(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _substitute(value, ctx, where, errors):
    if not isinstance(value, str):
        return value

    def repl(match):
        key = match.group(1)
        if key not in ctx or ctx[key] is None:
            errors.append("%s: placeholder {%s} has no value (known here: %s)" % (where, key, ", ".join(sorted(k for k in ctx if ctx[k] is not None))))
            return match.group(0)
        return _scalar(ctx[key])

    return PLACEHOLDER_RE.sub(repl, value)


def render_args(args, ctx, where, errors, expansions=None):
    """Turn an ordered {flag: value} mapping into an argv list (long names as given).

    true -> bare flag; false/None -> dropped; list -> flag v1 v2 ...; a value in `expansions` -> the list given there
    (already complete argv fragments, e.g. repeated --prefill URL PORT).
    """
    argv = []
    for flag, value in (args or {}).items():
        if value is None or value is False:
            continue
        if expansions and isinstance(value, str) and value in expansions:
            for fragment in expansions[value](flag):
                argv.extend(fragment)
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv.append(flag)
            argv.extend(_substitute(_scalar(v), ctx, where + " " + flag, errors) for v in value)
        else:
            argv.extend([flag, _substitute(_scalar(value), ctx, where + " " + flag, errors)])
    return argv


def _int_arg(args, flag, default):
    value = (args or {}).get(flag, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _check_value(opt_type, value):
    if opt_type in ("int",):
        int(value)
    elif opt_type == "float":
        float(value)
    elif opt_type == "human_readable_int":
        if not re.match(r"^-?\d+(\.\d+)?[kKmMgGtT]?$", value):
            raise ValueError(value)
    elif opt_type in ("loads", "json_list_type"):
        json.loads(value)


def check_server_args(args, catalog, version, where):
    """Check an {flag: value} mapping against the option catalog of one SGLang version: name, arity, type, choices."""
    errors = []
    for flag, value in (args or {}).items():
        if value is None or value is False:
            continue
        spec = catalog.get(flag)
        if spec is None:
            close = [f for f in catalog if f.startswith(flag)]
            hint = " (argparse would treat it as a prefix of %s; write the long name)" % ", ".join(sorted(close)[:3]) if close else ""
            errors.append("%s: flag %s is not an option of sglang %s%s" % (where, flag, version, hint))
            continue
        nargs = spec.get("nargs")
        if str(nargs) == "0":
            if value is not True:
                errors.append("%s: flag %s of sglang %s takes no value; expected true (or false to drop it), got %r" % (where, flag, version, value))
            continue
        if value is True:
            errors.append("%s: flag %s of sglang %s needs a value (type %s)" % (where, flag, version, spec.get("type")))
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        if isinstance(value, (list, tuple)) and nargs not in ("+", "*"):
            errors.append("%s: flag %s of sglang %s takes one value, got a list %r" % (where, flag, version, value))
            continue
        for v in values:
            text = _scalar(v)
            if PLACEHOLDER_RE.search(text):
                continue  # checked after substitution by the caller when it matters (ports are ints by construction)
            try:
                _check_value(spec.get("type"), text)
            except (TypeError, ValueError):
                errors.append("%s: flag %s of sglang %s expects type %s, got %r" % (where, flag, version, spec.get("type"), v))
                continue
            choices = spec.get("choices")
            if choices and text not in [str(c) for c in choices]:
                errors.append("%s: flag %s of sglang %s got %r; expected one of %s" % (where, flag, version, text, ", ".join(str(c) for c in choices)))
    return errors


def check_router_args(args, catalog, version, where):
    errors = []
    for flag, value in (args or {}).items():
        if value is None or value is False:
            continue
        spec = catalog.get(flag)
        if spec is None:
            errors.append("%s: flag %s is not an option of sglang-router %s" % (where, flag, version))
            continue
        nargs = spec.get("nargs")
        if str(nargs) == "0" and value is not True:
            errors.append("%s: router flag %s takes no value; expected true, got %r" % (where, flag, value))
        elif str(nargs) != "0" and value is True:
            errors.append("%s: router flag %s needs a value" % (where, flag))
        choices = spec.get("choices")
        if choices and not isinstance(value, bool) and _scalar(value) not in choices:
            errors.append("%s: router flag %s got %r; expected one of %s" % (where, flag, value, ", ".join(choices)))
    return errors


def candidate_nics(rdma_nics):
    """Usable ConnectX-8 data NICs, sorted (never a fabric-manager NIC such as the CX7)."""
    return sorted(d.get("name") for d in (rdma_nics or {}).get("devices") or []
                  if d.get("role") == "data" and d.get("usable") and d.get("model") == "ConnectX-8")


def choose_ib_devices(gpu_topology, rdma_nics, gpus, sysfs_root="/sys"):
    """NICs for --disaggregation-ib-device: affinity.nearest_nics restricted to usable ConnectX-8 data NICs.

    Returns (names in affinity order, error text or None)."""
    allowed = set(candidate_nics(rdma_nics))
    cx8_only = dict(rdma_nics or {})
    cx8_only["devices"] = [d for d in (rdma_nics or {}).get("devices") or [] if d.get("name") in allowed]
    try:
        return nearest_nics(gpu_topology, cx8_only, list(gpus), sysfs_root=sysfs_root), None
    except ValueError as exc:
        return [], str(exc)


def _positive(value):
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False


def _role_hosts(role_name, role, hosts_by_name):
    group = role.get("group")
    return [h for h in hosts_by_name.values() if group in (h.get("groups") or [])]


def build_plan(profile, hosts, settings, catalogs):
    errors, warnings = [], []
    instances = []
    settings = settings or {}
    profile = profile or {}
    pname = profile.get("name") or "?"
    if not profile.get("roles"):
        return {"instances": [], "router": None, "errors": ["profile %r is unknown or has no roles (expected one of the files in "
                                                            "roles/sglang_server/files/profiles/)" % pname], "warnings": []}

    version = str(settings.get("sglang_version") or profile.get("sglang_version") or "")
    router_version = str(settings.get("router_version") or profile.get("router_version") or "")
    if not VERSION_RE.match(version):
        errors.append("profile %s: sglang version %r is not pinned; expected an exact X.Y.Z such as %s" % (pname, version, profile.get("sglang_version")))
    if not VERSION_RE.match(router_version):
        errors.append("profile %s: sglang-router version %r is not pinned; expected an exact X.Y.Z such as %s" % (pname, router_version, profile.get("router_version")))
    server_catalog = (catalogs or {}).get("server", {}).get(version)
    router_catalog = (catalogs or {}).get("router", {}).get(router_version)
    if VERSION_RE.match(version) and server_catalog is None:
        errors.append("profile %s: no option catalog for sglang %s (expected roles/sglang_server/files/options/server-options-%s.json; known: %s)"
                      % (pname, version, version, ", ".join(sorted((catalogs or {}).get("server", {})))))
    if VERSION_RE.match(router_version) and router_catalog is None:
        errors.append("profile %s: sglang-router %s is unknown (expected roles/sglang_router/files/options/router-options-%s.json; known: %s)"
                      % (pname, router_version, router_version, ", ".join(sorted((catalogs or {}).get("router", {})))))
    combos = settings.get("known_combinations") or []
    if not any(str(c.get("sglang")) == version and str(c.get("router")) == router_version for c in combos):
        errors.append("profile %s: sglang %s with sglang-router %s is not a known combination; expected one of %s"
                      % (pname, version, router_version, ", ".join("%s+%s" % (c.get("sglang"), c.get("router")) for c in combos) or "(none)"))

    for name, value in sorted((settings.get("timeouts") or {}).items()):
        if not _positive(value):
            errors.append("setting %s: timeout %r must be a positive number of seconds" % (name, value))

    hosts_by_name = {}
    for h in hosts or []:
        hosts_by_name[h["name"]] = h
    model_root = str(settings.get("model_root") or "").rstrip("/")
    model_path = model_root + "/" + str(profile.get("model_dir") or "") if model_root else None
    if not model_root:
        errors.append("profile %s: sglang_model_root is empty; expected the directory holding %s" % (pname, profile.get("model_dir")))
    executable = str(settings.get("executable") or "/opt/sglang/{version}/bin/sglang").replace("{version}", version)
    env_dir = str(settings.get("env_dir") or "/etc/sglang").rstrip("/")
    unit_prefix = str(settings.get("unit_prefix") or "sglang")
    extra_args = settings.get("extra_args") or {}
    extra_env = settings.get("extra_env") or {}

    role_groups = {}
    for role_name in ROLE_ORDER:
        role = profile["roles"].get(role_name)
        if not role:
            continue
        role_groups[role_name] = role.get("group")
        role_hosts = _role_hosts(role_name, role, hosts_by_name)
        if not role_hosts:
            errors.append("profile %s: role %s has no host; expected at least one host in group %s" % (pname, role_name, role.get("group")))
        for host in role_hosts:
            hname = host["name"]
            if "gpu_nodes" not in (host.get("groups") or []):
                errors.append("%s: in group %s but not in gpu_nodes; expected every SGLang worker host in gpu_nodes" % (hname, role.get("group")))
            count = int(role.get("instances_per_host") or 1)
            for idx in range(count):
                iname = "%s%d" % (role.get("name_prefix") or role_name[0].upper(), idx)
                where = "%s/%s" % (hname, iname)
                ov = (host.get("instance_overrides") or {}).get(iname) or {}
                args = merge_overrides(role.get("args") or {}, extra_args)
                args = merge_overrides(args, ov.get("args") or {})
                env = {str(k): str(v) for k, v in merge_overrides(merge_overrides(role.get("env") or {}, extra_env), ov.get("env") or {}).items() if v is not None}
                tp = _int_arg(args, "--tp-size", 1)
                dp = _int_arg(args, "--dp-size", 1)
                if tp is None or dp is None or tp < 1 or dp < 1:
                    errors.append("%s: --tp-size %r / --dp-size %r must be positive integers" % (where, args.get("--tp-size"), args.get("--dp-size")))
                    tp, dp = tp or 1, dp or 1
                size = tp * dp
                gpus = ov.get("gpus")
                if gpus is None:
                    gpus = list(range(idx * size, (idx + 1) * size))
                gpus = [int(g) for g in gpus]
                if len(gpus) != size:
                    errors.append("%s: %d GPUs %s but --tp-size %d x --dp-size %d needs %d" % (where, len(gpus), gpus, tp, dp, size))
                gpu_count = ((host.get("gpu_topology") or {}).get("gpu_count"))
                if gpu_count is not None:
                    beyond = [g for g in gpus if g >= int(gpu_count) or g < 0]
                    if beyond:
                        errors.append("%s: GPU(s) %s do not exist; the host reports %d GPUs (indices 0-%d)" % (where, beyond, gpu_count, int(gpu_count) - 1))

                def _port(key, base):
                    if key in ov:
                        return ov[key]
                    return None if base is None else int(base) + idx

                port = _port("port", role.get("port_base"))
                nccl_port = _port("nccl_port", role.get("nccl_port_base"))
                bootstrap_port = _port("bootstrap_port", role.get("bootstrap_port_base"))
                for label, value in (("port", port), ("nccl_port", nccl_port), ("bootstrap_port", bootstrap_port)):
                    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535):
                        errors.append("%s: %s %r is not a TCP port; expected an integer 1-65535" % (where, label, value))

                ib_devices = None
                uses_ib = "--disaggregation-ib-device" in args and args.get("--disaggregation-ib-device") not in (None, False)
                if uses_ib:
                    rdma = host.get("rdma_nics")
                    if ov.get("ib_devices"):
                        ib_devices = [str(d) for d in ov["ib_devices"]]
                        if rdma is not None:
                            known = {d.get("name"): d for d in rdma.get("devices") or []}
                            for dev in ib_devices:
                                if dev not in known:
                                    errors.append("%s: --disaggregation-ib-device %s does not exist on %s; expected one of %s"
                                                  % (where, dev, hname, ", ".join(candidate_nics(rdma)) or "(no usable ConnectX-8)"))
                                elif known[dev].get("role") == "fabric_manager":
                                    errors.append("%s: --disaggregation-ib-device %s is the fabric-manager NIC (%s); expected a ConnectX-8 data NIC: %s"
                                                  % (where, dev, known[dev].get("model"), ", ".join(candidate_nics(rdma))))
                    elif rdma is None or host.get("gpu_topology") is None:
                        errors.append("%s: cannot choose --disaggregation-ib-device: rdma_nics/gpu_topology facts missing for %s; "
                                      "expected the facts (run preflight) or sglang_instance_overrides.%s.ib_devices" % (where, hname, iname))
                    else:
                        # the planner runs on the controller: the host's sysfs is not readable here, so only the topo matrix and
                        # NUMA nodes from the facts count (a path that does not exist disables the sysfs PCI walk)
                        ib_devices, why = choose_ib_devices(host.get("gpu_topology"), rdma, gpus, "/nonexistent/controller-has-no-host-sysfs")
                        if why:
                            errors.append("%s: cannot choose --disaggregation-ib-device on %s: %s" % (where, hname, why))
                        elif not ib_devices:
                            errors.append("%s: no usable ConnectX-8 data NIC near GPUs %s on %s (usable: %s); expected at least one"
                                          % (where, gpus, hname, ", ".join(candidate_nics(rdma)) or "none"))
                ctx = {
                    "model_path": model_path, "model_root": model_root or None,
                    "served_model_name": profile.get("served_model_name"),
                    "host": settings.get("bind_host") or "0.0.0.0", "port": port, "nccl_port": nccl_port,
                    "bootstrap_port": bootstrap_port,
                    # when the choice already failed (error recorded above) keep the argv readable, without a 2nd error
                    "ib_devices": ",".join(ib_devices) if ib_devices else ("<unresolved>" if uses_ib else None),
                }
                if server_catalog is not None:
                    errors.extend(check_server_args(args, server_catalog, version, where))
                for flag, value in args.items():
                    if "timeout" in flag and value is not None and not isinstance(value, bool) and not PLACEHOLDER_RE.search(_scalar(value)) and not _positive(value):
                        errors.append("%s: %s %r must be a positive number of seconds" % (where, flag, value))
                argv_args = render_args(args, ctx, where, errors)
                if settings.get("api_key_enabled"):
                    argv_args += ["--api-key", API_KEY_TOKEN]
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
                unit_base = "%s-%s-%s" % (unit_prefix, pname, iname.lower())
                address = host.get("address") or hname
                instances.append({
                    "name": iname, "id": where, "host": hname, "address": address, "role": role_name,
                    "profile": pname, "version": version, "gpus": gpus,
                    "cuda_visible_devices": env["CUDA_VISIBLE_DEVICES"],
                    "tp_size": tp, "dp_size": dp,
                    "port": port, "nccl_port": nccl_port, "bootstrap_port": bootstrap_port,
                    "ib_devices": ib_devices or [], "url": "http://%s:%s" % (address, port),
                    "executable": executable, "args": argv_args, "argv": [executable, "serve"] + argv_args,
                    "env": dict(sorted(env.items())),
                    "unit_name": unit_base + ".service", "env_file": "%s/%s-%s.env" % (env_dir, pname, iname.lower()),
                })

    # hosts that belong to none of the groups this profile uses
    used_groups = set(role_groups.values())
    for hname, host in sorted(hosts_by_name.items()):
        groups = set(host.get("groups") or [])
        if not groups & (used_groups | {(profile.get("router") or {}).get("group")}):
            errors.append("%s: host is in none of the groups of profile %s; expected one of %s"
                          % (hname, pname, ", ".join(sorted(g for g in used_groups | {(profile.get("router") or {}).get("group")} if g))))

    router = _plan_router(profile, instances, hosts_by_name, settings, router_catalog, router_version, model_path, errors)

    # ports unique per host (workers, nccl, bootstrap, router, prometheus)
    used = {}
    claims = []
    for inst in instances:
        for label in ("port", "nccl_port", "bootstrap_port"):
            if inst[label] is not None:
                claims.append((inst["host"], inst[label], "%s %s" % (inst["id"], label)))
    if router:
        claims.append((router["host"], router["port"], "%s/router port" % router["host"]))
        claims.append((router["host"], router["prometheus_port"], "%s/router prometheus_port" % router["host"]))
    for host, port, label in claims:
        key = (host, port)
        if key in used:
            errors.append("%s: %s %s collides with %s on %s; expected a port unique per host" % (host, label, port, used[key], host))
        else:
            used[key] = label
    # GPU sets disjoint per host
    by_host = {}
    for inst in instances:
        for gpu in inst["gpus"]:
            other = by_host.setdefault(inst["host"], {}).get(gpu)
            if other:
                errors.append("%s: GPU %d of %s is also used by %s; expected disjoint GPU sets per host" % (inst["host"], gpu, inst["id"], other))
            else:
                by_host[inst["host"]][gpu] = inst["id"]
    return {"instances": instances, "router": router, "errors": errors, "warnings": warnings,
            "profile": pname, "mode": profile.get("mode"), "version": version, "router_version": router_version,
            "model_path": model_path, "served_model_name": profile.get("served_model_name"),
            "needs_mooncake": bool(profile.get("needs_mooncake"))}


def _plan_router(profile, instances, hosts_by_name, settings, catalog, version, model_path, errors):
    rspec = profile.get("router") or {}
    if not rspec:
        return None
    pname = profile.get("name")
    group = rspec.get("group") or "sglang_router"
    rhosts = [h for h in hosts_by_name.values() if group in (h.get("groups") or [])]
    if len(rhosts) != 1:
        errors.append("profile %s: expected exactly one host in group %s for the router, found %d (%s)"
                      % (pname, group, len(rhosts), ", ".join(sorted(h["name"] for h in rhosts)) or "none"))
        if not rhosts:
            return None
    rhost = rhosts[0]
    args = merge_overrides(rspec.get("args") or {}, settings.get("router_extra_args") or {})
    port = rspec.get("port")
    prom_port = rspec.get("prometheus_port")
    where = "%s/router" % rhost["name"]
    for label, value in (("port", port), ("prometheus_port", prom_port)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
            errors.append("%s: %s %r is not a TCP port; expected an integer 1-65535" % (where, label, value))
    prom_host = settings.get("prometheus_host") or "127.0.0.1"
    if "--prometheus-port" not in args or args.get("--prometheus-port") in (None, False):
        errors.append("%s: --prometheus-port is not set; expected an explicit port (the default 29000 on 0.0.0.0 collides easily)" % where)
    ctx = {"model_path": model_path, "router_host": settings.get("router_bind_host") or "0.0.0.0", "router_port": port,
           "prometheus_host": prom_host, "prometheus_port": prom_port}
    prefill = [i for i in instances if i["role"] == "prefill"]
    decode = [i for i in instances if i["role"] == "decode"]
    workers = [i for i in instances if i["role"] == "worker"]
    expansions = {
        "{prefill_workers}": lambda flag: [[flag, i["url"], str(i["bootstrap_port"]) if i["bootstrap_port"] else "none"] for i in prefill],
        "{decode_workers}": lambda flag: [[flag, i["url"]] for i in decode],
        "{workers}": lambda flag: [[flag] + [i["url"] for i in workers]],
    }
    if catalog is not None:
        errors.extend(check_router_args({k: v for k, v in args.items() if v not in LIST_PLACEHOLDERS}, catalog, version, where))
    for flag, value in args.items():
        if ("timeout" in flag or "interval" in flag) and value is not None and not isinstance(value, bool) and not PLACEHOLDER_RE.search(_scalar(value)) and not _positive(value):
            errors.append("%s: router %s %r must be a positive number of seconds" % (where, flag, value))
    argv_args = render_args(args, ctx, where, errors, expansions)
    if settings.get("api_key_enabled"):
        argv_args += ["--api-key", API_KEY_TOKEN]
    python = str(settings.get("router_python") or "/opt/sglang-router/{version}/bin/python").replace("{version}", version)
    address = rhost.get("address") or rhost["name"]
    return {
        "host": rhost["name"], "address": address, "port": port, "prometheus_host": prom_host, "prometheus_port": prom_port,
        "version": version, "url": "http://%s:%s" % (address, port), "args": argv_args,
        "argv": [python, "-m", "sglang_router.launch_router"] + argv_args,
        "unit_name": "%s-router.service" % (settings.get("unit_prefix") or "sglang"),
        "env_file": "%s/router.env" % str(settings.get("env_dir") or "/etc/sglang").rstrip("/"),
        "workers": [{"url": i["url"], "worker_type": i["role"] if i["role"] != "worker" else "regular",
                     "bootstrap_port": i["bootstrap_port"], "id": i["id"]} for i in prefill + decode + workers],
    }
