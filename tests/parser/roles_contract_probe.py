"""Run INSIDE a CPU venv of the real sglang (tools/sglang_argcheck/build_venv.sh): prints one JSON object with what the
roles rely on, produced by sglang's own code (tests/parser/test_roles_contract.py reads it).

- loads: /v1/loads bodies as v1_loads.get_loads builds them (LoadSnapshot.to_dict(include) per dp rank) from the REAL
  SchedulerLoadInquirer.get_loads run over fake scheduler queues (a prefill with KV transfers in flight, a decode
  waiting for KV, a chunked prefill, idle workers). Only two imports are replaced: DisaggregationMode (its module pulls
  the CUDA stack; the same three values) and runtime_context.get_lora (needs a published server config; LoRA off).
- env: the defaults of the environment variables the profiles override or rely on (srt/environ.py).
- auth: decide_request_auth for the paths the roles call with and without the key (srt/utils/auth.py).
- chat: a short (max_tokens-truncated) answer of each profile's reasoning parser (glm45, kimi_k3) split by the REAL
  ReasoningParser and serialized with the REAL protocol classes the way serving_chat.py builds them (non-stream:
  content=text or "", reasoning_content=reasoning or None; stream: a delta with reasoning_content).
"""
import enum
import json
import os
import sys
import types

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "sglang_argcheck",
                             "standins"))
NS = types.SimpleNamespace


class DisaggregationMode(enum.Enum):      # srt/disaggregation/utils.py
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


_utils = types.ModuleType("sglang.srt.disaggregation.utils")
_utils.DisaggregationMode = DisaggregationMode
sys.modules["sglang.srt.disaggregation.utils"] = _utils

from sglang.srt.managers.scheduler_components import load_inquirer  # noqa: E402  the DisaggregationMode stand-in must be in place first
from sglang.srt.environ import envs  # noqa: E402  the DisaggregationMode stand-in must be in place first
from sglang.srt.utils.auth import AuthLevel, decide_request_auth  # noqa: E402  the DisaggregationMode stand-in must be in place first
from sglang.srt.parser.reasoning_parser import ReasoningParser  # noqa: E402  the DisaggregationMode stand-in must be in place first
from sglang.srt.entrypoints.openai.protocol import (  # noqa: E402  the DisaggregationMode stand-in must be in place first
    ChatCompletionResponse, ChatCompletionResponseChoice, ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse, ChatMessage, DeltaMessage, UsageInfo)
import sglang  # noqa: E402  the DisaggregationMode stand-in must be in place first

load_inquirer.get_lora = lambda: NS(enable_lora=False)


def reqs(n, seqlen=100, done=0):
    return [NS(seqlen=seqlen, num_matched_prefix_tokens=0, prefix_indices=[0] * done, waiting_for_input=False)
            for _ in range(n)]


def inquirer(mode, running=0, waiting=0, boot=0, inflight=0, prealloc=0, transfer=0, retracted=0, chunked=None):
    stats = NS(spec_accept_rate=0.0, kv_transfer_speed_gb_s=0.0, kv_transfer_latency_ms=0.0, num_grammar_queue_reqs=0,
               num_paused_reqs=0, num_retracted_reqs=0, gen_throughput=0.0, cache_hit_rate=0.0, utilization=0.0,
               lora_pool_slots_used=0, lora_pool_slots_total=0, lora_pool_utilization=0.0)
    return load_inquirer.SchedulerLoadInquirer(
        disaggregation_mode=DisaggregationMode[mode], ps=NS(dp_rank=0), server_args=None, max_total_num_tokens=1000,
        max_running_requests=8, pool_stats_observer=NS(get_pool_stats=lambda: NS(get_kv_token_stats=lambda: (0, 0.0))),
        tp_worker=NS(), token_to_kv_pool_allocator=NS(), spec_algorithm=NS(is_none=lambda: True),
        get_running_batch=lambda: NS(reqs=reqs(running)), get_waiting_queue=lambda: reqs(waiting),
        get_stats=lambda: stats, get_chunked_req=lambda: chunked,
        get_disagg_prefill_bootstrap_queue=lambda: NS(queue=reqs(boot)),
        get_disagg_prefill_inflight_queue=lambda: reqs(inflight),
        get_disagg_decode_prealloc_queue=lambda: NS(queue=reqs(prealloc), retracted_queue=reqs(retracted)),
        get_disagg_decode_transfer_queue=lambda: NS(queue=reqs(transfer)),
        get_spec_total_num_accept_tokens=lambda: 0, get_spec_total_num_forward_ct=lambda: 0,
        get_total_prefill_uncached_tokens=lambda: 0, get_total_prefill_busy_us=lambda: 0,
        get_decode_moment_totals=lambda: (0, 0.0, 0.0))


CASES = {
    "prefill_idle": dict(mode="PREFILL"),
    "prefill_kv_in_flight": dict(mode="PREFILL", inflight=2),
    "prefill_bootstrapping": dict(mode="PREFILL", boot=1),
    "prefill_chunked": dict(mode="PREFILL", chunked=reqs(1, seqlen=65536, done=16384)[0]),
    "decode_idle": dict(mode="DECODE"),
    "decode_waiting_for_kv": dict(mode="DECODE", transfer=1),
    "decode_prealloc": dict(mode="DECODE", prealloc=1),
    "decode_running": dict(mode="DECODE", running=3),
    "regular_idle": dict(mode="NULL"),
    "regular_running": dict(mode="NULL", running=1, waiting=2),
}


def body(case):
    snap = inquirer(**CASES[case]).get_loads()
    # v1_loads.get_loads: include "core,disagg" -> to_dict({"core", "disagg"}) per snapshot inside {"loads": [...]}
    return json.dumps({"timestamp": "2026-01-01T00:00:00+00:00", "version": sglang.__version__, "accelerator": None,
                       "num_accelerators": 4, "loads": [snap.to_dict({"core", "disagg"})]})


def legacy(case):
    # http_server.get_load (deprecated shim): num_reqs = running + waiting of the same snapshot
    r = inquirer(**CASES[case]).get_loads()
    return json.dumps([{"dp_rank": r.dp_rank, "num_reqs": r.num_running_reqs + r.num_waiting_reqs,
                        "num_waiting_reqs": r.num_waiting_reqs, "num_tokens": r.num_total_tokens,
                        "num_pending_tokens": r.num_total_tokens - r.num_used_tokens, "ts_tic": 0.0}])


def auth(path, header, key="K"):
    d = decide_request_auth(method="GET", path=path, authorization_header=header, api_key=key, admin_api_key=None,
                            auth_level=AuthLevel.NORMAL)
    return {"allowed": d.allowed, "status": None if d.allowed else d.error_status_code}


# model output cut at max_tokens: Kimi-K3 starts in reasoning mode without a tag; GLM opens <think>
SHORT = {"kimi_k3": "The user wants a greeting in five words. Let me", "glm45": "<think>The user wants a greeting"}


def chat(parser):
    reasoning, text = ReasoningParser(parser).parse_non_stream(SHORT[parser])
    full = ChatCompletionResponse(id="r", model="m", choices=[ChatCompletionResponseChoice(
        index=0, message=ChatMessage(role="assistant", content=text if text else "",
                                     reasoning_content=reasoning if reasoning else None),
        finish_reason="length")], usage=UsageInfo(prompt_tokens=9, completion_tokens=16, total_tokens=25))
    chunk = ChatCompletionStreamResponse(id="r", model="m", choices=[ChatCompletionResponseStreamChoice(
        index=0, delta=DeltaMessage(reasoning_content=reasoning), finish_reason=None)])
    return {"content": text, "reasoning": reasoning, "json": full.model_dump_json(),
            "sse": "data: %s\n\ndata: [DONE]\n\n" % chunk.model_dump_json()}


print(json.dumps({
    "version": sglang.__version__,
    "loads": {c: body(c) for c in CASES},
    "legacy": {c: legacy(c) for c in CASES},
    "env": {"SGLANG_WARMUP_TIMEOUT": envs.SGLANG_WARMUP_TIMEOUT.get(),
            "SGLANG_TIMEOUT_KEEP_ALIVE": envs.SGLANG_TIMEOUT_KEEP_ALIVE.get(),
            "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": envs.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION.get(),
            "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": envs.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT.get(),
            "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": envs.SGLANG_DISAGGREGATION_WAITING_TIMEOUT.get()},
    "auth": {"/v1/loads no key": auth("/v1/loads", None), "/v1/loads key": auth("/v1/loads", "Bearer K"),
             "/v1/loads wrong key": auth("/v1/loads", "Bearer X"), "/health no key": auth("/health", None)},
    "chat": {p: chat(p) for p in SHORT},
}))
