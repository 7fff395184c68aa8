"""The host stack stage (driver, CUDA, DOCA-OFED, fabric manager packages): its checks and plan (host_stack) and what
it reads from a host (host_stack_io)."""
