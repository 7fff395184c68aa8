"""The hardware as the facts modules read it: GPU topology and NUMA affinity (gpu_topology, affinity), the RDMA NICs
(rdma_nic), the firmware matrix that judges a NIC's firmware against its driver (fw_matrix: here because the facts
read the driver version with it, and the gate, the update and the triage judge with it), and the tool runner and
fact builders the modules share (tools)."""
