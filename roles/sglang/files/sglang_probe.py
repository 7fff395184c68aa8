#!/usr/bin/env python3
"""One readiness probe of an SGLang instance (run on its host by the sglang role, stdlib only).

  sglang_probe.py --unit sglang-kimi_k3-w0.service --url http://10.0.0.11:30000 [--generate] [--env-file F]

Prints one JSON line {"unit", "active_state", "sub_state", "n_restarts", "health", "generate", "detail"} and exits
0 when ready (unit active, GET /health 200 and, with --generate, POST /generate 200 with text), 1 when not yet,
3 when the unit has failed (no point in waiting further). The API key, if any, is read from SGLANG_API_KEY in the
instance env file (root-readable) so that it never appears on a command line or in Ansible output.
"""
import argparse
import json
import subprocess
import sys
import urllib.error
import urllib.request


def unit_state(unit):
    try:
        out = subprocess.run(["systemctl", "show", "-p", "ActiveState,SubState,NRestarts,Result", unit],
                             capture_output=True, text=True, timeout=15, check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ActiveState": "unknown", "detail": str(exc)}
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def api_key(env_file):
    if not env_file:
        return None
    try:
        with open(env_file) as fh:
            for line in fh:
                if line.startswith("SGLANG_API_KEY="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        return None
    return None


def call(url, key, body=None, timeout=10):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")[:300]
    except (urllib.error.URLError, OSError) as exc:
        return None, str(getattr(exc, "reason", exc))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--path", default="/health", help="readiness path (the router: /readiness)")
    ap.add_argument("--generate", action="store_true")
    ap.add_argument("--env-file")
    ap.add_argument("--prompt", default="Say hello.")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=10)
    ap.add_argument("--generate-timeout", type=float, default=300)
    a = ap.parse_args()
    st = unit_state(a.unit)
    res = {"unit": a.unit, "active_state": st.get("ActiveState"), "sub_state": st.get("SubState"),
           "n_restarts": st.get("NRestarts"), "result": st.get("Result"), "health": None, "generate": None, "detail": ""}
    if st.get("ActiveState") == "failed":
        res["detail"] = "unit failed (Result=%s); see journalctl -u %s" % (st.get("Result"), a.unit)
        print(json.dumps(res))
        return 3
    if st.get("ActiveState") != "active":
        res["detail"] = "unit is %s/%s" % (st.get("ActiveState"), st.get("SubState"))
        print(json.dumps(res))
        return 1
    key = api_key(a.env_file)
    status, body = call(a.url.rstrip("/") + a.path, key, timeout=a.timeout)
    res["health"] = status
    if status != 200:
        res["detail"] = "GET %s -> %s %s" % (a.path, status, body[:200])
        print(json.dumps(res))
        return 1
    if a.generate:
        status, body = call(a.url.rstrip("/") + "/generate", key, timeout=a.generate_timeout,
                            body={"text": a.prompt, "sampling_params": {"max_new_tokens": a.max_tokens, "temperature": 0}})
        res["generate"] = status
        text = None
        try:
            text = json.loads(body).get("text") if status == 200 else None
        except (ValueError, AttributeError):
            text = None
        if status != 200 or not isinstance(text, str):
            res["detail"] = "POST /generate -> %s %s" % (status, body[:200])
            print(json.dumps(res))
            return 1
        res["detail"] = "generated: %r" % text[:120]
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
