"""One focused test per NIC-output quirk found in the real outputs under tests/fixtures/real-world/{mlxfwmanager,
driver_version}/ (sources in their SOURCES.md). Texts here are cut down from those outputs; the whole outputs are
checked against hand-written answers by test_real_world_parsers.py."""
import pathlib

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.hw import rdma_nic

import synth

FIX = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "real-world"


def _fix(kind, name):
    return (FIX / kind / name).read_text()


def _block(num, name, fw, avail, status, mac="e09d73126474", extra=""):
    return ("Device #%d:\n----------\n\n  Device Type:      ConnectX7\n  PSID:             MT_0000001244\n"
            "  PCI Device Name:  %s\n  Base MAC:         %s\n  Versions:         Current        Available     \n"
            "     FW             %-14s %-14s\n%s\n  Status:           %s\n\n"
            % (num, name, mac, fw, avail, extra, status))


UPDATE_TAIL = ("---------\nFound 1 device(s) requiring firmware update...\n\nPerform FW update? [y/N]: y\n"
               "Device #1: Updating FW ...     \nFSMST_INITIALIZE -   OK          \n"
               "Writing Boot image component -   OK          \nDone\n\nRestart needed for updates to take effect.\n"
               "Log File: /tmp/mlxup_workdir/mlxup-20250109_190606_17886.log\n")


# ----------------------------------------------------------------- update runs (query part + update section)
def test_update_progress_lines_are_not_device_blocks():
    # "Device #1: Updating FW ..." / "Device #2: Up to date" once made extra empty records
    devs = rdma_nic.parse_mlxfwmanager(_fix("mlxfwmanager", "cx3pro_4nic_mst_online_update_log.txt"))
    assert len(devs) == 4
    assert [d["update_result"] for d in devs] == ["updated", "up to date", "updated", "up to date"]
    assert [d["fw_flashed"] for d in devs] == ["2.42.5000", None, "2.42.5000", None]


def test_update_log_query_current_is_the_old_image_and_the_burnt_one_is_pending():
    (rec,) = rdma_nic.parse_mlxfwmanager(_block(1, "0000:8e:00.0", "28.46.3048", "28.47.1026", "Update required")
                                         + UPDATE_TAIL)
    assert (rec["fw_current"], rec["fw_flashed"], rec["update_result"]) == ("28.46.3048", "28.47.1026", "updated")
    assert rdma_nic.pending_image(rec) == "28.47.1026"


def test_done_on_the_same_line_as_the_last_step():
    # DGX Spark mlnx-fw-updater: "Writing Boot image component -   OK      <many spaces>      Done"
    (rec,) = rdma_nic.parse_mlxfwmanager(_fix("mlxfwmanager", "cx7_dgx_spark_unindented_update_log.txt"))
    assert rec["update_result"] == "updated" and rdma_nic.pending_image(rec) == "28.47.1088"
    assert rec["device_type"] == "ConnectX7"  # keys printed at column 0


def test_update_without_done_leaves_the_flash_state_unknown():
    text = _block(1, "0000:8e:00.0", "28.46.3048", "28.47.1026", "Update required") + UPDATE_TAIL.split("Done")[0]
    (rec,) = rdma_nic.parse_mlxfwmanager(text)
    assert rec["update_result"] == "incomplete" and rec["fw_flashed"] is None
    assert rdma_nic.pending_image(rec) == "unknown"


def test_update_error_is_failed_and_pending_unknown():
    text = (_block(1, "0000:8e:00.0", "28.46.3048", "28.47.1026", "Update required")
            + "---------\nFound 1 device(s) requiring firmware update...\n\nDevice #1: Updating FW ...\n"
            "-E- Burning FW image failed\n")
    (rec,) = rdma_nic.parse_mlxfwmanager(text)
    assert rec["update_result"] == "failed" and rdma_nic.pending_image(rec) == "unknown"


def test_log_file_lines_after_the_update_do_not_leak_into_the_last_block():
    (rec,) = rdma_nic.parse_mlxfwmanager(_block(1, "0000:8e:00.0", "28.46.3048", "28.47.1026", "Update required")
                                         + UPDATE_TAIL + "Status:  bogus\n")
    assert rec["status"] == "Update required"


def _sysfs(tmp_path, name, pci, fw, guid="e09d:7303:0012:6474", psid="MT_0000001244"):
    synth.flat_ib_device(tmp_path, name, pci, fw, psid=psid, guid=guid, device_id="1021")


def test_update_log_pending_attributed_then_cleared_once_running(tmp_path):
    text = _block(1, "0000:8e:00.0", "28.42.1000", "28.43.1014", "Update required") + UPDATE_TAIL
    _sysfs(tmp_path / "before", "mlx5_0", "0000:8e:00.0", "28.42.1000")
    r = rdma_nic.build_rdma_nics(str(tmp_path / "before"), None, text, "6.8")
    assert r["devices"][0]["fw_pending"] == "28.43.1014" and r["devices"][0]["fw_record_match"] == "pci"
    _sysfs(tmp_path / "after", "mlx5_0", "0000:8e:00.0", "28.43.1014")
    r = rdma_nic.build_rdma_nics(str(tmp_path / "after"), None, text, "6.8")
    assert r["devices"][0]["fw_pending"] is None  # the log predates the reset; never the pre-update image


def test_update_log_pending_without_a_matching_device_is_a_host_finding(tmp_path):
    text = _block(1, "/dev/mst/mt4129_pciconf0", "28.42.1000", "28.43.1014", "Update required") + UPDATE_TAIL
    _sysfs(tmp_path, "mlx5_0", "0000:37:00.0", "28.42.1000", guid="0000:0000:0000:0000", psid="MT_0000000838")
    r = rdma_nic.build_rdma_nics(str(tmp_path), None, text.replace("e09d73126474", "0000000000aa"), "6.8")
    (u,) = r["fw_pending_unattributed"]
    assert (u["device"], u["fw_pending"], u["fw_running"]) == ("/dev/mst/mt4129_pciconf0", "28.43.1014", "28.42.1000")
    assert "pending a reset" in r["findings"][0]


# ----------------------------------------------------------------- query quirks
def test_port1_mac_is_the_base_mac_of_per_port_cards():
    (rec,) = rdma_nic.parse_mlxfwmanager(_fix("mlxfwmanager", "cx3_mlxup_port_mac_pci.txt"))
    assert (rec["base_mac"], rec["base_guid"]) == ("7cfe90bed011", None)


def test_pci_name_without_domain_is_normalised():
    (rec,) = rdma_nic.parse_mlxfwmanager(_fix("mlxfwmanager", "cx6dx_fw_updater_short_pci_update_log.txt"))
    assert (rec["pci_device_name"], rec["pci_address"]) == ("d2:00.0", "0000:d2:00.0")


def test_fragment_starting_at_device_13():
    (rec,) = rdma_nic.parse_mlxfwmanager(_fix("mlxfwmanager", "cx7_mst_device13_no_header.txt"))
    assert rec["mst_device"] == "/dev/mst/mt4129_pciconf0" and rec["fw_available"] is None


def test_mst_name_of_a_further_pci_function():
    (rec,) = rdma_nic.parse_mlxfwmanager(_block(1, "/dev/mst/mt4129_pciconf0.1", "28.42.1000", "N/A", "x"))
    assert (rec["mst_device"], rec["pci_address"]) == ("/dev/mst/mt4129_pciconf0.1", None)


def test_xml_query_format():
    (rec,) = rdma_nic.parse_mlxfwmanager(_fix("mlxfwmanager", "cx6lx_mlxup_query_format_xml.txt"))
    assert (rec["pci_address"], rec["psid"], rec["fw_current"], rec["fw_available"]) == (
        "0002:01:00.0", "MT_0000000575", "26.33.1048", "26.43.1014")
    assert (rec["base_guid"], rec["base_mac"], rec["status"]) == ("e8ebd3030070cf12", "e8ebd370cf12", "Update required")


def test_xml_running_row_and_failed_device_placeholders():
    # tag of the running image: the text row "FW (Running)" made into an XML name; "--" placeholders of a locked DPU
    text = ('<Devices>\n    <Device pciName="/dev/mst/mt41692_pciconf0" type="BlueField3" psid="MT_0000000884" '
            'partNumber="900-9D3B6-00CV-A_Ax">\n      <Versions>\n        <FW current="32.43.1014" available="N/A"/>\n'
            '        <FW_Running current="32.41.1000" available="N/A"/>\n      </Versions>\n'
            '      <MACs Base_Mac="a088c232137a" />\n      <Status>No matching image found</Status>\n'
            '      <Description></Description>\n    </Device>\n    <Device pciName="0000:b4:00.0" type="BlueField3" '
            'psid="" partNumber="--">\n      <Versions>\n        <FW current="--" available=""/>\n      </Versions>\n'
            '      <MACs Base_Mac="N/A" />\n      <GUIDs Base_Guid="--" />\n'
            '      <Status>Failed to open device</Status>\n      <Description></Description>\n'
            '    </Device>\n</Devices>\n')
    bf3, locked = rdma_nic.parse_mlxfwmanager(text)
    assert (bf3["mst_device"], bf3["fw_current"], bf3["fw_running"]) == (
        "/dev/mst/mt41692_pciconf0", "32.43.1014", "32.41.1000")
    assert rdma_nic.pending_image(bf3) == "32.43.1014"
    assert (locked["fw_current"], locked["psid"], locked["base_guid"], locked["status"]) == (
        None, None, None, "Failed to open device")


@pytest.mark.parametrize("text", [
    "-E- No devices found or specified, mst might be stopped, run 'mst start' to load MST modules\n",
    "mlxfwmanager: command not found\n",
    "<Devices>\n  <Device pciName=\"0000:01:00.0\"\n",
])
def test_output_not_understood_is_an_error_never_an_empty_list(text):
    with pytest.raises(ValueError):
        rdma_nic.parse_mlxfwmanager(text)


def test_output_not_understood_is_a_finding_in_the_facts(tmp_path):
    _sysfs(tmp_path, "mlx5_0", "0000:8e:00.0", "28.42.1000")
    r = rdma_nic.build_rdma_nics(str(tmp_path), None, "-E- Failed to query devices\n", "6.8")
    assert r["devices"][0]["fw_record_match"] is None
    assert any("not understood" in f and "-E- Failed to query devices" in f for f in r["findings"])


def test_empty_output_is_no_devices():
    assert rdma_nic.parse_mlxfwmanager("") == [] and rdma_nic.parse_mlxfwmanager("\n \n") == []


# ----------------------------------------------------------------- mst status
def test_mst_pciconf_row_without_address_takes_its_pci_cr_sibling():
    got = rdma_nic.parse_mst_status(_fix("mlxfwmanager", "cx3pro_4nic_mst_status_v_pciconf_without_pci.txt"))
    assert got["/dev/mst/mt4103_pciconf3"] == got["/dev/mst/mt4103_pci_cr3"] == "0000:06:00.0"
    assert got["mt4103_pciconf0"] == "0000:01:00.0"


def test_mst_row_without_address_and_without_sibling_stays_unmapped():
    got = rdma_nic.parse_mst_status("ConnectX3Pro(rev:0)     /dev/mst/mt4103_pciconf3     \n")
    assert got == {}


def test_mst_vfio_column_domains_and_pf1_names():
    got = rdma_nic.parse_mst_status(_fix("mlxfwmanager", "dgx_spark_mst_status_v_vfio_gb100_cx7_pf1.txt"))
    assert got["/dev/mst/mt4129_pciconf1.1"] == "0002:01:00.1"
    assert got["/dev/mst/mt11794_pci_cr0"] == "000f:01:00.0"


# ----------------------------------------------------------------- driver versions
def test_ofed_internal_24_04_is_doca_even_before_25():
    got = rdma_nic.classify_driver_version(
        _fix("driver_version", "ofed_info_doca_24.04_dgx_spark_before_upgrade.txt"))
    assert (got["flavour"], got["version"]) == ("doca_ofed", "24.04-0.6.6")


def test_mlnx_ofed_24_10_four_part_build_is_mlnx_ofed():
    got = rdma_nic.classify_driver_version("MLNX_OFED_LINUX-24.10-3.2.5.0:\n")
    assert (got["flavour"], got["version"], got["version_scheme"]) == ("mlnx_ofed", "24.10-3.2.5.0", "legacy")


def test_ofed_info_command_missing_is_unknown_not_a_version():
    got = rdma_nic.classify_driver_version("bash: ofed_info: command not found\n")
    assert got["flavour"] == "unknown" and got["version"] is None


@pytest.mark.parametrize("value,flavour,scheme", [
    ("6.8.0-41-generic", "inbox", "kernel"),
    ("5.14.0-427.13.1.el9_4.x86_64", "inbox", "kernel"),
    ("6.4.0-rc2-net-next-vm-lock-dbg+", "inbox", "kernel"),
    ("5.0-0", "inbox", "module"),          # the old in-kernel MODULE_VERSION
    ("5.8-1.1.2.1", "mlnx_ofed", "legacy"),  # two parts before the dash: an OFED version, never a kernel
    ("24.10-1.1.4.0.200", "mlnx_ofed", "legacy"),
    ("25.04-0.6.1", "doca_ofed", "legacy"),
    ("2410.1.1", "doca_ofed", "yymm"),     # four-digit first part: DOCA, not a kernel release
])
def test_ethtool_version_kernel_release_versus_ofed(value, flavour, scheme):
    got = rdma_nic.classify_driver_version("driver: mlx5_core\nversion: %s\nfirmware-version: 28.42.1000\n" % value)
    assert (got["flavour"], got["version"], got["version_scheme"]) == (flavour, value, scheme)


def test_ethtool_version_equal_to_the_hosts_kernel_release_is_inbox_whatever_its_shape():
    got = rdma_nic.classify_driver_version("version: 6.8.0-odd", kernel_release="6.8.0-odd")
    assert got["flavour"] == "inbox" and got["version_scheme"] == "kernel"
