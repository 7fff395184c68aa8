r"""Reader of SGLang's Prometheus /metrics text: ONE implementation, stdlib only.

Used by module_utils/verdicts/acceptance.py (the report, on the controller) and by roles/acceptance/files/acceptance_client.py
(on the client host: roles/acceptance copies THIS file next to the client, there is no second copy in the repository).
It must therefore import nothing but the standard library.

What it reads: the text exposition format 0.0.4 exactly as prometheus_client writes it (a real SGLang server mounts
prometheus_client's multiprocess collector at /metrics, srt/utils/common.py add_prometheus_middleware):
  - `# HELP` / `# TYPE` lines and any other comment (skipped), `# EOF` of OpenMetrics (skipped);
  - counters as `<name>_total` AND `<name>_created` (single-process registry): a `_created` series is a timestamp,
    never summed into the counter;
  - label values with the escapes `\\`, `\"` and `\n`, and with any other character inside the quotes (`}`, `,`,
    `=`, spaces: a model_name is free text), labels in any order, an optional trailing comma;
  - values as Go/Python floats: `1.0`, `1e+06`, `1.5E-3`, `+Inf`, `-Inf`, `NaN`; an optional timestamp after it;
  - many label sets per metric (model_name, engine_type, is_streaming, tp_rank, ...), summed by the callers;
  - series that do not exist yet: prometheus_client writes a labelled series only after its first observation, so a
    counter missing before the first request is 0, not an error.

The cached-token rule (sglang/srt/observability/metrics_collector.py, TokenizerMetricsCollector
observe_one_finished_request, 0.5.17 lines 1708-1752 / 0.5.18 lines 1740-1784): for each finished request with
cached_tokens > 0, EITHER its cached_tokens_details are present and the counter
`sglang:cached_tokens_total` is incremented per source, `cache_source="device"`, `"host"` and
`"storage_<backend>"` (each only when > 0), OR they are absent and the whole cached_tokens go to
`cache_source="total"` ("Fallback for backward compatibility"). The two branches are exclusive per request, so
"total" never repeats what device/host/storage already counted: the cached tokens of a label set are the sum over
EVERY cache_source value, "total" included (it only holds the requests that came without a breakdown; in 0.5.17 and
0.5.18 the scheduler always sends one when cached_tokens > 0, scheduler_components/output_streamer.py
get_cached_tokens_details, so on real servers "total" normally stays absent). Keeping only "total" (what this
project did before) counts 0 on a real server; keeping only the breakdown would drop the requests that had none.
A series without any cache_source label (older servers, the old sandbox stub) is counted as it is.
"""
import math

CACHED_TOKENS = "sglang:cached_tokens_total"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
NUM_REQUESTS = "sglang:num_requests_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
REALTIME_TOKENS = "sglang:realtime_tokens_total"
KV_TRANSFER_MB_SUM = "sglang:kv_transfer_total_mb_sum"
# what the acceptance client keeps per worker and sample: counter -> label filter
CLIENT_COUNTERS = {NUM_REQUESTS: {}, REALTIME_TOKENS: {"mode": "decode"}, GENERATION_TOKENS: {},
                   PROMPT_TOKENS: {}, CACHED_TOKENS: {}}

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _name_end(line, i):
    n = len(line)
    while i < n and (line[i].isalnum() or line[i] in "_:"):
        i += 1
    return i


def _labels(line, i):
    """Parse `{a="x",b="y"}` starting at line[i] == "{"; (labels, index after "}")."""
    labels = {}
    n = len(line)
    i += 1
    while True:
        while i < n and line[i] in " \t,":
            i += 1
        if i >= n:
            raise ValueError("unterminated label set")
        if line[i] == "}":
            return labels, i + 1
        j = _name_end(line, i)
        if j == i:
            raise ValueError("bad label name at column %d" % i)
        key = line[i:j]
        while j < n and line[j] in " \t":
            j += 1
        if j + 1 >= n or line[j] != "=" or line[j + 1] != '"':
            raise ValueError("label %s without a quoted value" % key)
        j += 2
        out = []
        while True:
            if j >= n:
                raise ValueError("unterminated value of label %s" % key)
            c = line[j]
            if c == "\\" and j + 1 < n:
                out.append(_ESCAPES.get(line[j + 1], "\\" + line[j + 1]))
                j += 2
                continue
            if c == '"':
                break
            out.append(c)
            j += 1
        labels[key] = "".join(out)
        i = j + 1


def parse_value(token):
    """A sample value as prometheus_client writes it (floatToGoString): 1.0, 1e+06, +Inf, -Inf, NaN."""
    low = token.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    return float(token)   # "NaN" -> nan, exponents, signs


def parse_line(line):
    """(name, {labels}, value) of one sample line, or None for a comment/blank line. ValueError when malformed."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    i = _name_end(line, 0)
    if i == 0:
        raise ValueError("no metric name")
    name = line[:i]
    labels = {}
    if i < len(line) and line[i] == "{":
        labels, i = _labels(line, i)
    rest = line[i:].split()
    if not rest:
        raise ValueError("no value")
    return name, labels, parse_value(rest[0])   # rest[1] (a timestamp) and OpenMetrics exemplars are ignored


def parse(text):
    """[(name, {labels}, value)] of every sample in a /metrics text; malformed lines are skipped (a scrape that
    failed is a comment line written by the client, "# scrape failed: ...")."""
    out = []
    for line in (text or "").splitlines():
        try:
            s = parse_line(line)
        except ValueError:
            continue
        if s is not None:
            out.append(s)
    return out


def counter_sum(samples, name, engine_type=None, **match):
    """Sum of one counter over every label set that matches: engine_type (a series without the label matches) and
    any label=value given. For sglang:cached_tokens_total every cache_source value counts (see the module text)."""
    total = 0.0
    for n, labels, value in samples:
        if n != name:
            continue
        if engine_type is not None and labels.get("engine_type", engine_type) != engine_type:
            continue
        if any(labels.get(k) != v for k, v in match.items()):
            continue
        if math.isnan(value):
            continue
        total += value
    return total


def cached_tokens_by_source(samples, engine_type=None):
    """{cache_source: tokens} of sglang:cached_tokens_total ("" for a series without the label)."""
    out = {}
    for n, labels, value in samples:
        if n != CACHED_TOKENS or math.isnan(value):
            continue
        if engine_type is not None and labels.get("engine_type", engine_type) != engine_type:
            continue
        src = labels.get("cache_source", "")
        out[src] = out.get(src, 0.0) + value
    return out


def cached_tokens(samples, engine_type=None):
    """Cached prompt tokens counted by a server: sum over every cache_source (device, host, storage_*, total)."""
    return counter_sum(samples, CACHED_TOKENS, engine_type)


def summarize(text, counters=None):
    """{counter: value} of one /metrics text, each counter summed over its label sets after its label filter
    (CLIENT_COUNTERS: realtime tokens only mode="decode"). Counters not written yet are absent (read as 0)."""
    counters = CLIENT_COUNTERS if counters is None else counters
    samples = parse(text)
    out = {}
    for name, match in counters.items():
        if any(s[0] == name for s in samples):
            out[name] = counter_sum(samples, name, **match)
    return out
