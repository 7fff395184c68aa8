"""SGLang serving: the deployment plan (sglang_plan, with the argparse abbreviation rules it checks flags by:
argparse_abbrev), the rollout's ordering and rollback decisions (sglang_rollout), the checks the role's filters call
(sglang_checks), the one /metrics reader (sglang_metrics; the acceptance client imports it flat), and the wheelhouse
manifest (wheelhouse)."""
