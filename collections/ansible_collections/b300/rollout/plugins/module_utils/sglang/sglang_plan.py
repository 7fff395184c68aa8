"""Plan SGLang instances and the router from a profile, inventory groups and host facts (pure, stdlib only).

Input (all plain data; see build_plan):
  profile   the profile YAML (roles/sglang/files/profiles/<name>.yml) after inventory overrides were merged
            (use merge_overrides), e.g. {"name": "glm52_pd", "mode": "pd", "roles": {...}, "router": {...}}
  hosts     [{"name": "b300a", "address": "10.0.0.1", "groups": ["gpu_nodes", ...],
              "gpu_topology": {...} | None, "rdma_nics": {...} | None,     # CONTRACTS.md fact schemas
              "instance_overrides": {"P0": {"gpus": [...], "ib_devices": [...], "port": N, "nccl_port": N,
                                            "bootstrap_port": N, "args": {...}, "env": {...}}}}]
  settings  {"sglang_version", "sglang_versions": {profile: version}, "router_version", "model_root", "executable", "bind_host", "router_bind_host",
             "prometheus_host", "known_combinations": [{"sglang","router"}], "api_key_enabled": bool,
             "timeouts": {"name": seconds}, "unit_prefix": "sglang", "env_dir": "/etc/sglang",
             "extra_args": {...}, "extra_env": {...},
             "router_flag_sets": {name: {flag: value}} (roles/sglang/files/router_flag_sets.yml),
             "router_flag_set": name (sglang_router_flags), "router_extra_args": {...}}
  catalogs  {"server": {version: {"--flag": {"action","type","nargs","choices"}}}, "router": {version: {...}}}

Output of build_plan: {"instances": [...], "router": {...} | None, "errors": [...], "warnings": [...]}.
Every error message names the host, the instance, the flag/port/GPU and the value expected.
"""

import copy
import ipaddress
import json
import re

from ansible_collections.b300.rollout.plugins.module_utils.hw.affinity import nearest_nics
from ansible_collections.b300.rollout.plugins.module_utils.sglang.argparse_abbrev import prefix_matches

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


def check_args(args, catalog, program, where):
    """Check an {flag: value} mapping against the option catalog of one program, e.g. program "sglang 0.5.17" or
    "sglang-router 0.3.2" (both parse with argparse): the name (an unknown one that argparse would take as a prefix
    is named), the arity (nargs 0: true only; a list only for nargs + or *), the type (where the catalog has one)
    and the choices. The one flag check of the plan, for the server's and the router's flags alike."""
    errors = []
    for flag, value in (args or {}).items():
        if value is None or value is False:
            continue
        spec = catalog.get(flag)
        if spec is None:
            close = prefix_matches(flag, catalog)
            hint = " (argparse would treat it as a prefix of %s; write the long name)" % ", ".join(close[:3]) if close else ""
            errors.append("%s: flag %s is not an option of %s%s" % (where, flag, program, hint))
            continue
        nargs = spec.get("nargs")
        if str(nargs) == "0":
            if value is not True:
                errors.append("%s: flag %s of %s takes no value; expected true (or false to drop it), got %r" % (where, flag, program, value))
            continue
        if value is True:
            errors.append("%s: flag %s of %s needs a value%s" % (where, flag, program, " (type %s)" % spec["type"] if spec.get("type") else ""))
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        if isinstance(value, (list, tuple)) and nargs not in ("+", "*"):
            errors.append("%s: flag %s of %s takes one value, got a list %r" % (where, flag, program, value))
            continue
        for v in values:
            text = _scalar(v)
            if PLACEHOLDER_RE.search(text):
                continue  # checked after substitution by the caller when it matters (ports are ints by construction)
            try:
                _check_value(spec.get("type"), text)
            except (TypeError, ValueError):
                errors.append("%s: flag %s of %s expects type %s, got %r" % (where, flag, program, spec.get("type"), v))
                continue
            choices = spec.get("choices")
            if choices and text not in [str(c) for c in choices]:
                errors.append("%s: flag %s of %s got %r; expected one of %s" % (where, flag, program, text, ", ".join(str(c) for c in choices)))
    return errors


def router_flag_set_names(profile, flag_sets):
    """Every router flag set name: the shared ones (router_flag_sets.yml) and any the profile adds."""
    return sorted(set(flag_sets or {}) | set((profile or {}).get("router_flag_sets") or {}))


def router_flag_set(profile, flag_sets, name):
    """The router flags of flag set `name` for this profile: the shared definition (flag_sets, the data of
    roles/sglang/files/router_flag_sets.yml) with the profile's own differences for that set (its
    router_flag_sets.<name>) on top. None when neither defines `name`. The one place a flag set is resolved."""
    own = (profile or {}).get("router_flag_sets") or {}
    if name not in (flag_sets or {}) and name not in own:
        return None
    return merge_overrides((flag_sets or {}).get(name) or {}, own.get(name) or {})


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


def resolve_versions(profile, settings):
    """(sglang version, sglang-router version) a plan deploys, as strings ('' when none is given anywhere).

    The ONE place the version is chosen (tools and tasks ask the plan, never repeat this): the run's own
    settings["sglang_version"] (roles/sglang sglang_version, e.g. -e), else the site's choice for this profile
    settings["sglang_versions"][<profile name>] (inventory, kept after a version change so re-runs deploy it), else the
    profile's pin (roles/sglang/files/profiles/<name>.yml sglang_version). The router: settings["router_version"], else
    the profile's router_version."""
    per_profile = settings.get("sglang_versions") or {}
    version = settings.get("sglang_version") or per_profile.get(profile.get("name")) or profile.get("sglang_version")
    router_version = settings.get("router_version") or profile.get("router_version")
    return str(version or ""), str(router_version or "")


def _check_versions(profile, settings, catalogs, pname, errors):
    """Pinned X.Y.Z versions, their option catalogs and a known sglang+router combination.

    Returns (version, router_version, server_catalog, router_catalog)."""
    version, router_version = resolve_versions(profile, settings)
    if not VERSION_RE.match(version):
        errors.append("profile %s: sglang version %r is not pinned; expected an exact X.Y.Z such as %s" % (pname, version, profile.get("sglang_version")))
    if not VERSION_RE.match(router_version):
        errors.append("profile %s: sglang-router version %r is not pinned; expected an exact X.Y.Z such as %s"
                      % (pname, router_version, profile.get("router_version")))
    server_catalog = (catalogs or {}).get("server", {}).get(version)
    router_catalog = (catalogs or {}).get("router", {}).get(router_version)
    if VERSION_RE.match(version) and server_catalog is None:
        errors.append("profile %s: no option catalog for sglang %s (expected roles/sglang/files/options/server-options-%s.json; known: %s)"
                      % (pname, version, version, ", ".join(sorted((catalogs or {}).get("server", {})))))
    if VERSION_RE.match(router_version) and router_catalog is None:
        errors.append("profile %s: sglang-router %s is unknown (expected roles/sglang/files/options/router-options-%s.json; known: %s)"
                      % (pname, router_version, router_version, ", ".join(sorted((catalogs or {}).get("router", {})))))
    combos = settings.get("known_combinations") or []
    if not any(str(c.get("sglang")) == version and str(c.get("router")) == router_version for c in combos):
        errors.append("profile %s: sglang %s with sglang-router %s is not a known combination; expected one of %s"
                      % (pname, version, router_version, ", ".join("%s+%s" % (c.get("sglang"), c.get("router")) for c in combos) or "(none)"))
    return version, router_version, server_catalog, router_catalog


def _check_timeouts(settings, errors):
    for name, value in sorted((settings.get("timeouts") or {}).items()):
        if not _positive(value):
            errors.append("setting %s: timeout %r must be a positive number of seconds" % (name, value))


def _common_settings(profile, settings, version, pname, errors):
    """Values shared by every instance: model path, executable, env dir, unit prefix, extra args/env."""
    model_root = str(settings.get("model_root") or "").rstrip("/")
    model_path = model_root + "/" + str(profile.get("model_dir") or "") if model_root else None
    if not model_root:
        errors.append("profile %s: sglang_model_root is empty; expected the directory holding %s" % (pname, profile.get("model_dir")))
    return {
        "pname": pname, "version": version, "model_root": model_root, "model_path": model_path,
        "served_model_name": profile.get("served_model_name"),
        "executable": str(settings.get("executable") or "/opt/sglang/{version}/bin/sglang").replace("{version}", version),
        "env_dir": str(settings.get("env_dir") or "/etc/sglang").rstrip("/"),
        "unit_prefix": str(settings.get("unit_prefix") or "sglang"),
        "extra_args": settings.get("extra_args") or {}, "extra_env": settings.get("extra_env") or {},
        "bind_host": settings.get("bind_host") or "0.0.0.0", "api_key_enabled": settings.get("api_key_enabled"),
    }


def _instance_args_env(role, common, ov):
    """The instance's args and env: the role's, then settings' extras, then the instance override (later wins)."""
    args = merge_overrides(role.get("args") or {}, common["extra_args"])
    args = merge_overrides(args, ov.get("args") or {})
    env = merge_overrides(merge_overrides(role.get("env") or {}, common["extra_env"]), ov.get("env") or {})
    return args, {str(k): str(v) for k, v in env.items() if v is not None}


def _gpu_set(where, idx, args, ov, host, errors):
    """GPUs of instance number idx: the override's list, else the idx-th block of tp x dp GPUs. Returns (tp, dp, gpus)."""
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
    return tp, dp, gpus


def _check_tcp_port(where, label, value, errors):
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        errors.append("%s: %s %r is not a TCP port; expected an integer 1-65535" % (where, label, value))


def instance_port(role, ov, idx, key):
    """One port of instance number idx: the override's `key` if given, else the role's `<key>_base` + idx (None without a base).

    key is "port", "nccl_port" or "bootstrap_port": P0's bootstrap port is bootstrap_port_base, P1's base + 1, ..."""
    if key in ov:
        return ov[key]
    base = role.get(key + "_base")
    return None if base is None else int(base) + idx


def _instance_ports(where, idx, role, ov, errors):
    """(port, nccl_port, bootstrap_port) of one instance, each checked to be a TCP port when set."""
    ports = tuple(instance_port(role, ov, idx, key) for key in ("port", "nccl_port", "bootstrap_port"))
    for label, value in zip(("port", "nccl_port", "bootstrap_port"), ports):
        if value is not None:
            _check_tcp_port(where, label, value, errors)
    return ports


def _check_named_ib_devices(where, hname, ib_devices, rdma, errors):
    """Devices named in an override must exist on the host and must not be the fabric-manager NIC."""
    known = {d.get("name"): d for d in rdma.get("devices") or []}
    for dev in ib_devices:
        if dev not in known:
            errors.append("%s: --disaggregation-ib-device %s does not exist on %s; expected one of %s"
                          % (where, dev, hname, ", ".join(candidate_nics(rdma)) or "(no usable ConnectX-8)"))
        elif known[dev].get("role") == "fabric_manager":
            errors.append("%s: --disaggregation-ib-device %s is the fabric-manager NIC (%s); expected a ConnectX-8 data NIC: %s"
                          % (where, dev, known[dev].get("model"), ", ".join(candidate_nics(rdma))))


def _rdma_devices(where, host, iname, args, ov, gpus, errors):
    """NICs for --disaggregation-ib-device when the args use it: the override's list, else the usable ConnectX-8 data
    NICs nearest the instance's GPUs. Returns (ib_devices or None, uses_ib)."""
    uses_ib = "--disaggregation-ib-device" in args and args.get("--disaggregation-ib-device") not in (None, False)
    if not uses_ib:
        return None, False
    hname = host["name"]
    rdma = host.get("rdma_nics")
    if ov.get("ib_devices"):
        ib_devices = [str(d) for d in ov["ib_devices"]]
        if rdma is not None:
            _check_named_ib_devices(where, hname, ib_devices, rdma, errors)
        return ib_devices, True
    if rdma is None or host.get("gpu_topology") is None:
        errors.append("%s: cannot choose --disaggregation-ib-device: rdma_nics/gpu_topology facts missing for %s; "
                      "expected the facts (run preflight) or sglang_instance_overrides.%s.ib_devices" % (where, hname, iname))
        return None, True
    # the planner runs on the controller: the host's sysfs is not readable here, so only the topo matrix and
    # NUMA nodes from the facts count (a path that does not exist disables the sysfs PCI walk)
    ib_devices, why = choose_ib_devices(host.get("gpu_topology"), rdma, gpus, "/nonexistent/controller-has-no-host-sysfs")
    if why:
        errors.append("%s: cannot choose --disaggregation-ib-device on %s: %s" % (where, hname, why))
    elif not ib_devices:
        errors.append("%s: no usable ConnectX-8 data NIC near GPUs %s on %s (usable: %s); expected at least one"
                      % (where, gpus, hname, ", ".join(candidate_nics(rdma)) or "none"))
    return ib_devices, True


def _check_arg_timeouts(where, args, words, errors, prefix=""):
    """Any flag whose name holds one of `words` (e.g. "timeout") must be a positive number of seconds."""
    for flag, value in args.items():
        if any(w in flag for w in words) and value is not None and not isinstance(value, bool) \
                and not PLACEHOLDER_RE.search(_scalar(value)) and not _positive(value):
            errors.append("%s: %s%s %r must be a positive number of seconds" % (where, prefix, flag, value))


def _is_ip(text):
    try:
        ipaddress.ip_address(str(text))
        return True
    except ValueError:
        return False


def instance_env(env, gpus, address, where, warnings):
    """The instance's environment: its GPUs as CUDA_VISIBLE_DEVICES and, unless the profile/override sets it,
    SGLANG_HOST_IP = the host's advertise address (sglang_advertise_address, else ansible_host), so the PD bootstrap
    (ZMQ) and the Mooncake handshake bind to the data-network address instead of get_local_ip_auto()'s guess
    (127.0.1.1 on many Debian/Ubuntu hosts). An address that is a name, not an IP, is left out with a warning."""
    env = dict(env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    if "SGLANG_HOST_IP" not in env:
        if _is_ip(address):
            env["SGLANG_HOST_IP"] = str(address)
        else:
            warnings.append("%s: advertise address %r is not an IP address, so SGLANG_HOST_IP is not set and SGLang binds "
                            "its PD bootstrap/Mooncake handshake to get_local_ip_auto(); expected sglang_advertise_address "
                            "set to the host's data-network IP" % (where, address))
    return dict(sorted(env.items()))


def _plan_instance(role_name, role, host, idx, common, server_catalog, errors, warnings):
    """One SGLang instance (e.g. P0 on b300a): args, GPUs, ports, RDMA devices, env, argv and unit names."""
    hname = host["name"]
    pname = common["pname"]
    iname = "%s%d" % (role.get("name_prefix") or role_name[0].upper(), idx)
    where = "%s/%s" % (hname, iname)
    ov = (host.get("instance_overrides") or {}).get(iname) or {}
    args, env = _instance_args_env(role, common, ov)
    tp, dp, gpus = _gpu_set(where, idx, args, ov, host, errors)
    port, nccl_port, bootstrap_port = _instance_ports(where, idx, role, ov, errors)
    ib_devices, uses_ib = _rdma_devices(where, host, iname, args, ov, gpus, errors)
    ctx = {
        "model_path": common["model_path"], "model_root": common["model_root"] or None,
        "served_model_name": common["served_model_name"],
        "host": common["bind_host"], "port": port, "nccl_port": nccl_port,
        "bootstrap_port": bootstrap_port,
        # when the choice already failed (error recorded above) keep the argv readable, without a 2nd error
        "ib_devices": ",".join(ib_devices) if ib_devices else ("<unresolved>" if uses_ib else None),
    }
    if server_catalog is not None:
        errors.extend(check_args(args, server_catalog, "sglang %s" % common["version"], where))
    _check_arg_timeouts(where, args, ("timeout",), errors)
    argv_args = render_args(args, ctx, where, errors)
    if common["api_key_enabled"]:
        argv_args += ["--api-key", API_KEY_TOKEN]
    address = host.get("address") or hname
    env = instance_env(env, gpus, address, where, warnings)
    unit_base = "%s-%s-%s" % (common["unit_prefix"], pname, iname.lower())
    return {
        "name": iname, "id": where, "host": hname, "address": address, "role": role_name,
        "profile": pname, "version": common["version"], "gpus": gpus,
        "cuda_visible_devices": env["CUDA_VISIBLE_DEVICES"],
        "tp_size": tp, "dp_size": dp,
        "port": port, "nccl_port": nccl_port, "bootstrap_port": bootstrap_port,
        "ib_devices": ib_devices or [], "url": "http://%s:%s" % (address, port),
        "executable": common["executable"], "args": argv_args, "argv": [common["executable"], "serve"] + argv_args,
        "env": env,
        "unit_name": unit_base + ".service", "env_file": "%s/%s-%s.env" % (common["env_dir"], pname, iname.lower()),
    }


def _plan_role(role_name, role, hosts_by_name, common, server_catalog, errors, warnings):
    """Every instance of one role (prefill, decode or worker) on every host of its group."""
    instances = []
    role_hosts = _role_hosts(role_name, role, hosts_by_name)
    if not role_hosts:
        errors.append("profile %s: role %s has no host; expected at least one host in group %s" % (common["pname"], role_name, role.get("group")))
    for host in role_hosts:
        if "gpu_nodes" not in (host.get("groups") or []):
            errors.append("%s: in group %s but not in gpu_nodes; expected every SGLang worker host in gpu_nodes" % (host["name"], role.get("group")))
        for idx in range(int(role.get("instances_per_host") or 1)):
            instances.append(_plan_instance(role_name, role, host, idx, common, server_catalog, errors, warnings))
    return instances


def _check_unused_hosts(profile, hosts_by_name, used_groups, pname, errors):
    """Hosts that belong to none of the groups this profile uses."""
    wanted = used_groups | {(profile.get("router") or {}).get("group")}
    for hname, host in sorted(hosts_by_name.items()):
        if not set(host.get("groups") or []) & wanted:
            errors.append("%s: host is in none of the groups of profile %s; expected one of %s"
                          % (hname, pname, ", ".join(sorted(g for g in wanted if g))))


def _check_port_collisions(instances, router, errors):
    """Ports unique per host (workers, nccl, bootstrap, router, prometheus)."""
    used = {}
    claims = []
    for inst in instances:
        for label in ("port", "nccl_port", "bootstrap_port"):
            if inst[label] is not None:
                claims.append((inst["host"], inst[label], "%s %s" % (inst["id"], label)))
    if router:
        claims.append((router["host"], router["port"], "%s/router port" % router["host"]))
        claims.append((router["host"], router["prometheus_port"], "%s/router prometheus_port" % router["host"]))
        if router.get("front"):
            claims.append((router["host"], router["listen_port"], "%s/router backend_port" % router["host"]))
    for host, port, label in claims:
        key = (host, port)
        if key in used:
            errors.append("%s: %s %s collides with %s on %s; expected a port unique per host" % (host, label, port, used[key], host))
        else:
            used[key] = label


def _check_gpu_overlap(instances, errors):
    """GPU sets disjoint per host."""
    by_host = {}
    for inst in instances:
        for gpu in inst["gpus"]:
            other = by_host.setdefault(inst["host"], {}).get(gpu)
            if other:
                errors.append("%s: GPU %d of %s is also used by %s; expected disjoint GPU sets per host" % (inst["host"], gpu, inst["id"], other))
            else:
                by_host[inst["host"]][gpu] = inst["id"]


def build_plan(profile, hosts, settings, catalogs):
    """Plan every instance and the router; see the module docstring for the shapes."""
    errors, warnings = [], []
    settings = settings or {}
    profile = profile or {}
    pname = profile.get("name") or "?"
    if not profile.get("roles"):
        return {"instances": [], "router": None, "errors": ["profile %r is unknown or has no roles (expected one of the files in "
                                                            "roles/sglang/files/profiles/)" % pname], "warnings": []}
    version, router_version, server_catalog, router_catalog = _check_versions(profile, settings, catalogs, pname, errors)
    _check_timeouts(settings, errors)
    hosts_by_name = {h["name"]: h for h in hosts or []}
    common = _common_settings(profile, settings, version, pname, errors)

    instances, used_groups = [], set()
    for role_name in ROLE_ORDER:
        role = profile["roles"].get(role_name)
        if role:
            used_groups.add(role.get("group"))
            instances.extend(_plan_role(role_name, role, hosts_by_name, common, server_catalog, errors, warnings))
    _check_unused_hosts(profile, hosts_by_name, used_groups, pname, errors)
    router = _plan_router(profile, instances, hosts_by_name, settings, router_catalog, router_version, common["model_path"], errors)
    _check_port_collisions(instances, router, errors)
    _check_gpu_overlap(instances, errors)
    return {"instances": instances, "router": router, "errors": errors, "warnings": warnings,
            "profile": pname, "mode": profile.get("mode"), "version": version, "router_version": router_version,
            "model_path": common["model_path"], "served_model_name": profile.get("served_model_name"),
            "needs_mooncake": bool(profile.get("needs_mooncake"))}


def _router_host(rspec, hosts_by_name, pname, errors):
    """The one host of the router's group (default sglang_router); None when there is none."""
    group = rspec.get("group") or "sglang_router"
    rhosts = [h for h in hosts_by_name.values() if group in (h.get("groups") or [])]
    if len(rhosts) != 1:
        errors.append("profile %s: expected exactly one host in group %s for the router, found %d (%s)"
                      % (pname, group, len(rhosts), ", ".join(sorted(h["name"] for h in rhosts)) or "none"))
    return rhosts[0] if rhosts else None


def _router_expansions(instances):
    """Placeholders that become repeated argv fragments: {prefill_workers} -> --prefill URL BOOTSTRAP_PORT per prefill..."""
    prefill = [i for i in instances if i["role"] == "prefill"]
    decode = [i for i in instances if i["role"] == "decode"]
    workers = [i for i in instances if i["role"] == "worker"]
    return {
        "{prefill_workers}": lambda flag: [[flag, i["url"], str(i["bootstrap_port"]) if i["bootstrap_port"] else "none"] for i in prefill],
        "{decode_workers}": lambda flag: [[flag, i["url"]] for i in decode],
        "{workers}": lambda flag: [[flag] + [i["url"] for i in workers]],
    }


def _router_workers(instances):
    """The router's worker list, prefill first, then decode, then regular workers."""
    ordered = [i for role in ("prefill", "decode", "worker") for i in instances if i["role"] == role]
    return [{"url": i["url"], "worker_type": i["role"] if i["role"] != "worker" else "regular",
             "bootstrap_port": i["bootstrap_port"], "id": i["id"]} for i in ordered]


# sglang-router 0.3.2's --worker-startup-timeout-secs when the flag is absent (router-0.3.2-help.txt)
ROUTER_WORKER_STARTUP_TIMEOUT_DEFAULT = 1800


def _check_router_startup_timeout(where, args, settings, errors):
    """After a power cycle the router and the workers start together, with no Ansible run: the router registers a
    worker only within --worker-startup-timeout-secs and then never again until it restarts. It must be at least
    the cold-start budget the deploy itself grants a worker (sglang_health_timeout_s)."""
    value = args.get("--worker-startup-timeout-secs")
    # absent, or dropped with false: the router's default applies
    startup = ROUTER_WORKER_STARTUP_TIMEOUT_DEFAULT if value is None or value is False else _int_arg(
        args, "--worker-startup-timeout-secs", None)
    health = (settings.get("timeouts") or {}).get("sglang_health_timeout_s")
    if startup is None or not _positive(health) or startup >= float(health):
        return
    errors.append("%s: router --worker-startup-timeout-secs %d is below sglang_health_timeout_s %s (the time a worker "
                  "may take to load); expected >= %s: after a reboot the router would give up on a worker still "
                  "loading and never add it until the router restarts; fix: raise it with sglang_router_extra_args "
                  "{\"--worker-startup-timeout-secs\": %s} or lower sglang_health_timeout_s"
                  % (where, startup, health, health, health))


def _plan_router(profile, instances, hosts_by_name, settings, catalog, version, model_path, errors):
    rspec = profile.get("router") or {}
    if not rspec:
        return None
    rhost = _router_host(rspec, hosts_by_name, profile.get("name"), errors)
    if rhost is None:
        return None
    args = rspec.get("args") or {}
    if settings.get("router_flag_set") is not None:
        name = settings["router_flag_set"]
        flag_set = router_flag_set(profile, settings.get("router_flag_sets"), name)
        if flag_set is None:
            errors.append("profile %s: sglang_router_flags=%s is not a router flag set; expected one of %s "
                          "(roles/sglang/files/router_flag_sets.yml, or the profile's router_flag_sets)"
                          % (profile.get("name"), name, ", ".join(router_flag_set_names(profile, settings.get("router_flag_sets")))))
        args = merge_overrides(args, flag_set or {})
    args = merge_overrides(args, settings.get("router_extra_args") or {})
    port = rspec.get("port")
    prom_port = rspec.get("prometheus_port")
    where = "%s/router" % rhost["name"]
    _check_tcp_port(where, "port", port, errors)
    _check_tcp_port(where, "prometheus_port", prom_port, errors)
    prom_host = settings.get("prometheus_host") or "127.0.0.1"
    if "--prometheus-port" not in args or args.get("--prometheus-port") in (None, False):
        errors.append("%s: --prometheus-port is not set; expected an explicit port (the default 29000 on 0.0.0.0 collides easily)" % where)
    bind_host = settings.get("router_bind_host") or "0.0.0.0"
    front_on = bool((settings.get("router_front") or {}).get("enabled"))
    # behind the front (issue 32) the router listens on loopback only, on backend_port; the front owns `port`
    listen_host, listen_port = ("127.0.0.1", rspec.get("backend_port")) if front_on else (bind_host, port)
    if front_on:
        _check_tcp_port(where, "backend_port (the router's own port behind its front)", listen_port, errors)
    ctx = {"model_path": model_path, "router_host": listen_host, "router_port": listen_port,
           "prometheus_host": prom_host, "prometheus_port": prom_port}
    if catalog is not None:
        known = {k: v for k, v in args.items() if v not in LIST_PLACEHOLDERS}
        errors.extend(check_args(known, catalog, "sglang-router %s" % version, where))
    _check_arg_timeouts(where, args, ("timeout", "interval"), errors, prefix="router ")
    _check_router_startup_timeout(where, args, settings, errors)
    argv_args = render_args(args, ctx, where, errors, _router_expansions(instances))
    if settings.get("api_key_enabled"):
        argv_args += ["--api-key", API_KEY_TOKEN]
    python = str(settings.get("router_python") or "/opt/sglang-router/{version}/bin/python").replace("{version}", version)
    address = rhost.get("address") or rhost["name"]
    prefix = settings.get("unit_prefix") or "sglang"
    local_host = "127.0.0.1" if listen_host in ("0.0.0.0", "::", "") else listen_host
    front = _plan_front(settings.get("router_front") or {}, args, prefix, bind_host, port, listen_port) if front_on else None
    return {
        "host": rhost["name"], "address": address, "port": port, "prometheus_host": prom_host, "prometheus_port": prom_port,
        "version": version, "url": "http://%s:%s" % (address, port), "args": argv_args,
        "argv": [python, "-m", "sglang_router.launch_router"] + argv_args,
        "unit_name": "%s-router.service" % prefix,
        "env_file": "%s/router.env" % str(settings.get("env_dir") or "/etc/sglang").rstrip("/"),
        "workers": _router_workers(instances),
        # where the router process itself listens, and the URL the role's own calls use on the router host
        "listen_host": listen_host, "listen_port": listen_port,
        "local_url": "http://%s:%s" % ("[%s]" % local_host if ":" in str(local_host) else local_host, listen_port),
        "front": front,
    }


# sglang-router 0.3.2 defaults (router-0.3.2-help.txt): --request-timeout-secs 1800, --queue-timeout-secs 60,
# --retry-max-retries 5 (attempts in all, ../shared/reference/sglang-router-contract.md §7)
ROUTER_REQUEST_TIMEOUT_DEFAULT = 1800
ROUTER_QUEUE_TIMEOUT_DEFAULT = 60
ROUTER_ATTEMPTS_DEFAULT = 5


def front_timeout_s(args):
    """The front's client/server inactivity timeout: longer than the router can keep a request (its queue timeout,
    then every attempt's request timeout), plus a minute; otherwise the front would cut a long request the router
    still serves."""
    request = _int_arg(args, "--request-timeout-secs", None) or ROUTER_REQUEST_TIMEOUT_DEFAULT
    queue = _int_arg(args, "--queue-timeout-secs", None) or ROUTER_QUEUE_TIMEOUT_DEFAULT
    attempts = 1 if args.get("--disable-retries") else (_int_arg(args, "--retry-max-retries", None) or ROUTER_ATTEMPTS_DEFAULT)
    return queue + request * max(attempts, 1) + 60


def _plan_front(cfg, args, prefix, bind_host, port, backend_port):
    """The router's front (issue 32): HAProxy owns the public port and forwards to the router on loopback; while the
    router restarts (a key added or removed, a new version, a flag) a connection it refuses is retried every second
    for `retries` seconds (HAProxy retries + its 1 s turn-around), so no client sees a refused connection."""
    return {"unit_name": "%s-router-front.service" % prefix, "config": cfg.get("config") or "/etc/haproxy/%s-router-front.cfg" % prefix,
            "bind_host": bind_host, "port": port, "backend": "127.0.0.1:%s" % backend_port,
            "health_path": cfg.get("health_path") or "/front-health", "retries": int(cfg.get("retries") or 10),
            "timeout_s": front_timeout_s(args), "user": cfg.get("user") or "haproxy"}


# --- the plan as the units carry it ---------------------------------------------------------------------------------
# `make plan` (playbooks/plan.yml) and the preflight (roles/sglang/tasks/plan.yml, "Validate | show the plan")
# print the same text: the unit and env file of every instance and of the router, rendered by the role's own
# templates (roles/sglang/templates/etc/...), reduced to the lines that say what runs and with which environment.
# Nothing here renders a command line: the lines are read back out of the rendered files.

UNIT_KEYS_SHOWN = ("ExecStartPre", "ExecStart", "Environment", "EnvironmentFile")
SECRET_WORDS = frozenset(("KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"))
MASK = "<masked>"
PLAN_SEPARATOR = "\n\n"
_ASSIGNMENT_RE = re.compile(r'(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>"(?:[^"\\]|\\.)*"|\S*)')
_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "s": " "}


def is_secret_name(name):
    """True for a variable or flag name one of whose words (split at _ and -) names a secret: SGLANG_API_KEY,
    HF_TOKEN, --api-key, --admin-api-key; not SGLANG_..._MAX_TOKENS_PER_RANK (TOKENS is not TOKEN)."""
    return bool(set(re.split(r"[_\-]+", str(name).upper().strip("-"))) & SECRET_WORDS)


def _masked_value(value):
    return '"%s"' % MASK if len(value) >= 2 and value[0] == value[-1] == '"' else MASK


def mask_assignments(text):
    """Every NAME=VALUE in text (VALUE bare or double-quoted) whose NAME names a secret gets VALUE <masked>."""
    def repl(match):
        if not is_secret_name(match.group("name")):
            return match.group(0)
        return "%s=%s" % (match.group("name"), _masked_value(match.group("value")))
    return _ASSIGNMENT_RE.sub(repl, text)


def mask_env_file_line(line):
    """One line of an EnvironmentFile: NAME=VALUE, VALUE up to the end of the line (quotes kept, value masked)."""
    name, sep, value = line.partition("=")
    if not sep or not is_secret_name(name.strip()):
        return line
    return "%s=%s" % (name, _masked_value(value.strip()))


def split_exec_line(value):
    """Split the value of an ExecStart= line into (prefix, argv) the way systemd does: words separated by blanks,
    double or single quotes group, C escapes inside them, then $$ -> $ and %% -> %. ("$${X}" reaches the program
    as the literal ${X}; an unescaped ${X} systemd would replace with the variable's value: shown as written.)"""
    prefix = re.match(r"^[-@:+!]*", value).group(0)
    text, argv, i = value[len(prefix):], [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        word, quote = [], None
        while i < len(text) and (quote or not text[i].isspace()):
            char = text[i]
            if quote is None and char in "\"'":
                quote = char
            elif char == quote:
                quote = None
            elif char == "\\" and i + 1 < len(text):
                i += 1
                word.append(_C_ESCAPES.get(text[i], text[i]))
            else:
                word.append(char)
            i += 1
        argv.append("".join(word).replace("$$", "$").replace("%%", "%"))
    return prefix, argv


def _secret_flag(word):
    return word.startswith("--") and is_secret_name(word.split("=", 1)[0])


def mask_argv(argv):
    """--api-key VALUE and --api-key=VALUE (any flag naming a secret) get VALUE <masked>, unless VALUE is a ${VAR}
    reference (the key itself never is in argv: the launcher puts it there inside the process)."""
    out = []
    for i, word in enumerate(argv):
        prev = argv[i - 1] if i else ""
        if _secret_flag(word) and "=" in word:
            word = word.split("=", 1)[0] + "=" + MASK
        elif _secret_flag(prev) and "=" not in prev and not word.startswith("--") \
                and not re.match(r"^\$\{\w+\}$", word):
            word = MASK
        out.append(word)
    return out


def unit_lines_shown(unit_text):
    """The lines of a rendered unit that say what runs and with which environment (UNIT_KEYS_SHOWN), in file
    order, secrets masked."""
    out = []
    for line in (unit_text or "").splitlines():
        key = line.split("=", 1)[0]
        if key not in UNIT_KEYS_SHOWN or "=" not in line:
            continue
        if key == "Environment":
            line = "Environment=" + mask_assignments(line[len("Environment="):])
        elif key in ("ExecStart", "ExecStartPre") and _has_secret_flag_value(line):
            line = _mask_exec_line(line)
        out.append(line)
    return out


def _has_secret_flag_value(line):
    prefix, argv = split_exec_line(line.split("=", 1)[1])
    return mask_argv(argv) != argv


def _mask_exec_line(line):
    """An Exec line that carries a secret flag value: shown rebuilt from the masked argv (quoted like the units)."""
    key, value = line.split("=", 1)
    prefix, argv = split_exec_line(value)
    return "%s=%s%s" % (key, prefix, exec_start_line(mask_argv(argv)))


def env_lines_shown(env_text):
    """The assignments of a rendered env file (comments and blank lines dropped), secrets masked."""
    return [mask_env_file_line(line) for line in (env_text or "").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def exec_argv(unit_lines):
    """(prefix, argv) of the ExecStart= line among unit_lines (already masked), ([], '') when there is none."""
    for line in unit_lines:
        if line.startswith("ExecStart="):
            return split_exec_line(line[len("ExecStart="):])
    return "", []


def _view(kind, unit_path, unit_text, env_path, env_text):
    lines = unit_lines_shown(unit_text)
    prefix, argv = exec_argv(lines)
    return {"kind": kind, "unit_path": unit_path, "unit_lines": lines, "env_file": env_path,
            "env_lines": env_lines_shown(env_text), "exec_prefix": prefix, "argv": argv}


def instance_view(inst, unit_text, env_text, unit_dir="/etc/systemd/system"):
    """What one planned instance (an entry of build_plan's instances) runs: the facts of the plan plus the lines of
    its rendered unit and env file."""
    view = _view("instance", "%s/%s" % (unit_dir, inst["unit_name"]), unit_text, inst["env_file"], env_text)
    view.update({k: inst.get(k) for k in ("id", "host", "address", "name", "role", "profile", "version", "gpus",
                                          "cuda_visible_devices", "port", "nccl_port", "bootstrap_port",
                                          "ib_devices", "url", "unit_name")})
    return view


def front_view(router, unit_text, config_text, unit_dir="/etc/systemd/system"):
    """What the router's front (build_plan's router.front) runs: its unit and its HAProxy config (in env_lines: the
    config's lines without comments; the config holds no secret)."""
    front = router["front"]
    view = _view("front", "%s/%s" % (unit_dir, front["unit_name"]), unit_text, front["config"], config_text)
    view.update({k: front.get(k) for k in ("unit_name", "port", "bind_host", "backend", "health_path", "retries",
                                           "timeout_s")})
    view.update({"host": router["host"], "address": router["address"], "url": router["url"],
                 "id": "%s/router-front" % router["host"], "name": "router-front"})
    return view


def router_view(router, unit_text, env_text, unit_dir="/etc/systemd/system"):
    """What the planned router (build_plan's router) runs, with the lines of its rendered unit and env file."""
    view = _view("router", "%s/%s" % (unit_dir, router["unit_name"]), unit_text, router["env_file"], env_text)
    view.update({k: router.get(k) for k in ("host", "address", "version", "port", "prometheus_host",
                                            "prometheus_port", "url", "unit_name", "workers", "listen_host",
                                            "listen_port")})
    view["front"] = bool(router.get("front"))
    view["id"] = "%s/router" % router["host"]
    view["name"] = "router"
    return view


def _shell_word(word):
    return word if re.match(r"^[A-Za-z0-9_@%+=:,./${}-]+$", word) else "'" + word.replace("'", "'\"'\"'") + "'"


def argv_display(argv, indent="    "):
    """argv one flag per line: the program and its leading words first, then each --flag with its values (words
    shell-quoted where needed)."""
    groups = [[]]
    for word in argv:
        if word.startswith("--") and groups[-1]:
            groups.append([])
        groups[-1].append(word)
    return [indent + ("  " if n else "") + " ".join(_shell_word(w) for w in g) for n, g in enumerate(groups) if g]


def _block_lines(title, path, lines):
    return ["  %s %s" % (title, path)] + ["    " + line for line in lines]


def view_text(view):
    """The text block of one view (see plan_text)."""
    files = "env file"
    if view["kind"] == "router":
        where = ("port %s" % view["port"]) if not view.get("front") else (
            "listens %s:%s behind its front (public port %s)" % (view["listen_host"], view["listen_port"], view["port"]))
        head = ["%s router: sglang-router %s, %s, metrics %s:%s, URL %s" % (
            view["host"], view["version"], where, view["prometheus_host"], view["prometheus_port"], view["url"])]
        head += ["  worker %s %s%s" % (w.get("worker_type"), w.get("url"),
                                       (" bootstrap %s" % w["bootstrap_port"]) if w.get("bootstrap_port") else "")
                 for w in view.get("workers") or []]
    elif view["kind"] == "front":
        files = "config"
        head = ["%s router front: haproxy, port %s:%s -> the router at %s, a refused connection retried %s x 1 s, "
                "health %s, timeouts %s s, URL %s" % (view["host"], view["bind_host"], view["port"], view["backend"],
                                                      view["retries"], view["health_path"], view["timeout_s"],
                                                      view["url"])]
    else:
        ports = ["port %s" % view["port"]] + ["%s %s" % (k.replace("_", " "), view[k])
                                              for k in ("nccl_port", "bootstrap_port") if view.get(k) is not None]
        head = ["%s %s (%s, profile %s, sglang %s): GPUs %s, %s, RDMA %s, URL %s" % (
            view["host"], view["name"], view["role"], view["profile"], view["version"], view["cuda_visible_devices"],
            ", ".join(ports), ",".join(view.get("ib_devices") or []) or "none", view["url"])]
    lines = head + _block_lines("unit", view["unit_path"], view["unit_lines"])
    lines += _block_lines(files, view["env_file"], view["env_lines"])
    prefix = (", prefix " + view["exec_prefix"]) if view["exec_prefix"] else ""
    lines += ["  argv (ExecStart= as systemd splits it%s)" % prefix]
    lines += argv_display(view["argv"])
    return "\n".join(line.rstrip() for line in lines)


def plan_text(views):
    """The plan as text: one block per view, in the order given; plan_text(a + b) == plan_text(a) + PLAN_SEPARATOR
    + plan_text(b), so the whole plan is the hosts' blocks one after the other."""
    return PLAN_SEPARATOR.join(view_text(v) for v in views)
