"""Quirks met in further real nccl-tests / nvidia-smi dmon outputs (fixtures under tests/fixtures/real-world/)."""
import pathlib

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.health import nccl_results, thermal

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "real-world"

HDR = ("#       size         count      type   redop    root     time   algbw   busbw  #wrong"
       "     time   algbw   busbw  #wrong")
ROW = ("     1048576        262144     float     sum      -1   339.61    3.09    3.09       0"
       "   335.85    3.12    3.12       0")


def _fixture(kind, name):
    return (ROOT / kind / name).read_text()


# ------------------------------------------------------------------------------------------------ nccl-tests
def test_alltoall_in_place_wrong_na_is_none_and_not_counted():
    out = nccl_results.parse_text(_fixture("nccl_tests", "cx8_2x8_alltoall_none_inplace_wrong_na.txt"))
    assert len(out["rows"]) == 24 and {r["redop"] for r in out["rows"]} == {"none"}
    assert all(r["in_place"]["wrong"] is None and r["out_of_place"]["wrong"] == 0 for r in out["rows"])
    assert nccl_results.wrong_total(out["rows"]) == 0
    assert out["version"] == "2.18.3" and out["collective"] == "alltoall_perf" and out["concluded"]


def test_ngpus_perproc_header_and_orphan_fragment_is_not_a_row():
    out = nccl_results.parse_text(_fixture("nccl_tests", "cetus_16xh200_info_interleaved_orphan_fragment.txt"))
    assert out["ngpus"] == 1 and out["nthreads"] is None and out["min_bytes"] == 1
    assert out["info_lines"] == 5
    assert out["rows"][0]["size"] == 0 and out["rows"][0]["out_of_place"]["time_us"] == 0.36
    assert nccl_results.parse_row("    579.3    0.00    0.00      0    137.0    0.00    0.00      0") is None


def test_rank_lines_without_group_of_old_versions():
    text = ("[1,0]<stdout>:#   Rank  0 Pid     26 on nccl-tests-efa-worker-0 device  0 [0x10] A100-SXM4-40GB\n"
            "[1,0]<stdout>:#  Rank  1 Group  0 Pid     27 on nccl-tests-efa-worker-0 device  1 [0x10] "
            "A100-SXM4-40GB\n")
    ranks = nccl_results.parse_text(text)["ranks"]
    assert [(r["rank"], r["group"], r["gpu_name"]) for r in ranks] == [(0, None, "A100-SXM4-40GB"),
                                                                       (1, 0, "A100-SXM4-40GB")]


def test_cuda_failure_glued_to_a_row_start_is_a_failure_not_a_row():
    text = _fixture("nccl_tests", "h800_2x8_alltoall_cuda_failure_no_rows.txt")
    out = nccl_results.parse_text(text)
    assert out["rows"] == [] and len(out["ranks"]) == 16
    assert "Test CUDA failure common.cu:389" in out["failures"][0] and len(out["failures"]) == 7
    res = nccl_results.analyze_repeat(0, 1, False, text, None)
    assert res["status"] == "error" and "illegal memory access" in res["detail"]


def test_per_iteration_columns_are_mapped_by_header():
    # nccl-tests -I 1 -S 1: i_min i_max i_p99 i_cv% after #wrong in both halves, a timestamp column at the end
    hdr = ("#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max"
           "    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%"
           "            timestamp")
    row = ("  1073741824     268435456     float     sum      -1   4396.8  244.21  457.90       0   4390.1   4410.0"
           "   4409.0     0.12   4382.1  245.03  459.43       0   4380.0   4399.0   4398.0     0.10"
           "  2026-09-26 10:00:00")
    out = nccl_results.parse_text(hdr + "\n" + row + "\n")
    assert out["layout"]["width"] == 8
    r = out["rows"][0]
    assert (r["size"], r["root"], r["timestamp"]) == (1073741824, -1, "2026-09-26 10:00:00")
    assert r["out_of_place"] == {"time_us": 4396.8, "algbw": 244.21, "busbw": 457.90, "wrong": 0.0}
    assert r["in_place"] == {"time_us": 4382.1, "algbw": 245.03, "busbw": 459.43, "wrong": 0.0}


def test_timestamp_column_alone_and_cputime_header():
    hdr = HDR.replace("time", "cputime") + "            timestamp"
    row = ROW + "  2026-01-02 03:04:05"
    r = nccl_results.parse_text(hdr + "\n" + row + "\n")["rows"][0]
    assert r["out_of_place"]["busbw"] == 3.09 and r["in_place"]["time_us"] == 335.85
    assert r["timestamp"] == "2026-01-02 03:04:05"
    # without the header, the default 4-cell layout still takes a timestamped row
    assert nccl_results.parse_row(row)["out_of_place"]["time_us"] == 339.61


def test_unknown_table_header_skips_rows_with_a_clear_error():
    hdr = HDR.rsplit("algbw", 1)[0] + "foo   bar  #wrong"  # halves differ: not a layout we know
    text = hdr + "\n" + ROW + "\n# Out of bounds values : 0 OK\n"
    out = nccl_results.parse_text(text)
    assert out["rows"] == [] and out["skipped_rows"] == 1 and out["unknown_headers"]
    res = nccl_results.analyze_repeat(0, 0, False, text, None)
    assert res["status"] == "error" and res["rule"] == "unparsable" and "unknown layout" in res["detail"]


def test_truncated_sizes_comment_and_gb300_none_redop():
    out = nccl_results.parse_text(_fixture("nccl_tests", "gb300_4gpu_alltoall_truncated_sizes_comment.txt"))
    assert [r["size"] for r in out["rows"]] == [8589934592, 17179869184]
    assert out["version"] is None and out["collective"] == "alltoall_perf" and out["concluded"]


# ------------------------------------------------------------------------------------------------ dmon
def test_dmon_old_driver_temp_column_is_the_gpu_temperature():
    out = thermal.parse_dmon(_fixture("dmon", "1gpu_old_driver_temp_column.txt"))
    assert [s["temp_c"] for s in out["samples"]][:2] == [63.0, 63.0] and "temp" in out["fields"]
    res = thermal.analyse_host(out["samples"], params={"ceiling_c": 60})
    assert res["verdict"] == "hot"


def test_dmon_row_with_echoed_ctrl_c_is_malformed_not_read():
    out = thermal.parse_dmon(_fixture("dmon", "1gpu_pucvmet_DT_ctrl_c.txt"))
    assert len(out["samples"]) == 3 and out["malformed"] == 1
    assert all(s["reasons"] == set() for s in out["samples"])  # -s v sampled: pviol/tviol 0
    assert out["samples"][0]["extra"]["sbecc"] is None and out["samples"][0]["extra"]["rxpci"] == 0.0


def test_dmon_gpm_metric_columns_with_dashes_stay_extra():
    out = thermal.parse_dmon(_fixture("dmon", "8gpu_gpm_metrics_dash.txt"))
    assert sorted({s["index"] for s in out["samples"]}) == list(range(8)) and out["t_synthetic"]
    assert out["samples"][0]["extra"]["gract"] is None and out["samples"][1]["extra"]["nvltx"] == 0.0
    assert out["samples"][0]["mem_temp_c"] == 28.0


@pytest.mark.parametrize("name", ["gb10_1gpu_mclk_dash.txt", "a100_2gpu_pucm_indented.txt"])
def test_dmon_dash_clock_and_indented_block(name):
    out = thermal.parse_any(_fixture("dmon", name))
    assert out["sampler"] == "dmon" and out["malformed"] == 0 and out["samples"]
    if name.startswith("gb10"):
        assert out["samples"][0]["mem_mhz"] is None and out["samples"][0]["sm_mhz"] == 208.0
