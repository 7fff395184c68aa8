"""GPU health over time and under load: the thermal soak's verdict (thermal), the health history's format and window
reader (health_history; the sampler on each host imports both files flat, next to it), and the NCCL tests' results
and verdict (nccl_results)."""
