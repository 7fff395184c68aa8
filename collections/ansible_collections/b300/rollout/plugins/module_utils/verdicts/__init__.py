"""The go-live verdicts: the acceptance run's verdict and report (acceptance), the answer-quality gate (quality_gate),
and the concurrency sweep's knee (sweep)."""
