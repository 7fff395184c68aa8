"""The ConnectX firmware products: the update's decisions and report (fw_update), its engine that runs flint and
mlxfwreset (fw_update_run), and the gate/audit check's engine (fw_check_run). The matrix they judge with is
hw/fw_matrix.py."""
